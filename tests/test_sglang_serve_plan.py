"""`hs-dataset serve` planning without a server environment (the probe of the server Python is faked)."""

from __future__ import annotations

import json

import pytest

from hs_dataset.serve import plan as serve


OLD_LAYER = "class DeepseekV2DecoderLayer:\n    def forward(self, positions, hidden_states, forward_batch, residual):\n        return hidden_states, residual\n"


def fake_sglang(root, layer_source: str = OLD_LAYER) -> str:
    """A stand-in ``sglang`` package directory holding only ``srt/models/deepseek_v2.py``."""
    models = root / "sglang" / "srt" / "models"
    models.mkdir(parents=True, exist_ok=True)
    (models / "deepseek_v2.py").write_text(layer_source)
    return str(root / "sglang")


@pytest.fixture
def fake_env(monkeypatch, tmp_path):
    info = {"sglang": "0.5.23", "hs_dataset": True, "sgl_kernel": None, "sglang_dir": fake_sglang(tmp_path / "env")}
    monkeypatch.setattr(serve, "_probe_server_env", lambda python: dict(info))
    return info


def _kimi_dir(tmp_path):
    d = tmp_path / "kimi"
    d.mkdir()
    cfg = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": {"num_hidden_layers": 61, "hidden_size": 7168, "architectures": ["DeepseekV3ForCausalLM"]}}
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_kimi_plan_has_every_capture_flag(fake_env, tmp_path):
    from hs_dataset.config import load_card

    plan = serve.plan_server(load_card("kimi-k25-sglang"), model_path=str(_kimi_dir(tmp_path)), staging_dir=str(tmp_path / "st"))
    argv = plan.argv
    joined = " ".join(argv)
    assert "--tp-size 8" in joined and "--dtype bfloat16" in joined
    assert "--enable-return-aux-hidden-states --speculative-algorithm EAGLE3 --return-aux-hidden-state-layer-ids 2 30 58" in joined
    assert "--disable-radix-cache" in argv and "--disable-prefill-cuda-graph" in argv and "--device" not in argv
    specs = json.loads(argv[argv.index("--forward-hooks") + 1])
    targets = {s["name"]: s["target_modules"] for s in specs}
    assert targets == {"hs_capture_final": ["language_model.model.norm"], "hs_capture": ["language_model.model"]}
    assert specs[0]["config"]["hf_aux_layer_ids"] == [2, 30, 58] and specs[0]["config"]["sglang_aux_layer_ids"] == [2, 30, 58]
    assert "PYTHONPATH" not in plan.env  # hs_dataset installed in the server env, real sgl_kernel on GPU


def test_tiny_cpu_plan_and_old_versions(fake_env, monkeypatch, tmp_path):
    from hs_dataset.config import load_card

    card = load_card("tiny-deepseek-sglang")
    fake_env.update(hs_dataset=False)
    plan = serve.plan_server(card, port=31999, staging_dir=str(tmp_path / "st"))
    assert plan.env["SGLANG_USE_CPU_ENGINE"] == "1" and "cpu_support" in plan.env["PYTHONPATH"]
    specs = json.loads(plan.argv[plan.argv.index("--forward-hooks") + 1])
    assert [s["name"] for s in specs] == ["hs_cpu_mla", "hs_capture_final", "hs_capture"]
    fake_env.update(sglang="0.5.9")
    plan = serve.plan_server(card, staging_dir=str(tmp_path / "st"))
    specs = json.loads(plan.argv[plan.argv.index("--forward-hooks") + 1])
    assert plan.mechanism == "layer_hooks" and "--enable-return-aux-hidden-states" not in plan.argv
    assert {s["target_modules"][0] for s in specs if s["name"].startswith("hs_capture_aux")} == {"model.layers.1", "model.layers.2", "model.layers.3"}
    assert "--disable-prefill-cuda-graph" not in plan.argv
    fake_env.update(sglang="0.5.5")
    with pytest.raises(serve.ServeError, match="hs-dataset patch"):
        serve.plan_server(card, staging_dir=str(tmp_path / "st"))
    fake_env.update(sglang="0.4.10")
    with pytest.raises(serve.ServeError):
        serve.plan_server(card, staging_dir=str(tmp_path / "st"))


def test_unexpressible_layer_ids_are_refused_before_starting(fake_env, tmp_path):
    from hs_dataset.config import load_card

    card = load_card("tiny-deepseek-sglang").with_overrides(layers={"aux": [1, 2]})
    with pytest.raises(serve.ServeError, match="start with 1"):
        serve.plan_server(card, staging_dir=str(tmp_path / "st"))


def test_serve_check_cli(fake_env, capsys):
    from hs_dataset.cli.main import main

    assert main(["serve", "--config", "tiny-deepseek-sglang", "--check", "--port", "31998", "--", "--log-level", "warning"]) == 0
    out = capsys.readouterr().out
    assert "mechanism: aux_return" in out and "--log-level warning" in out and "--port 31998" in out

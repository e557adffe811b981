"""`hs-dataset serve` planning without a server environment (the probe of the server Python is faked)."""

from __future__ import annotations

import json

import pytest

from hs_dataset.capture.serve import plan as serve, probe
from hs_dataset.capture.serve.errors import ServeError
from tests.fixtures.fake_sglang import ALWAYS, fake_sglang


@pytest.fixture
def fake_env(monkeypatch, tmp_path):
    info = {"sglang": "0.5.23", "hs_dataset": True, "sgl_kernel": None, "sglang_dir": fake_sglang(tmp_path / "env")}
    monkeypatch.setattr(probe, "probe_server_env", lambda python: dict(info))
    return info


def _kimi_dir(tmp_path):
    d = tmp_path / "kimi"
    d.mkdir()
    cfg = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "text_config": {"num_hidden_layers": 61, "hidden_size": 7168, "architectures": ["DeepseekV3ForCausalLM"]},
    }
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"num_hidden_layers": 10**9}, "num_hidden_layers"),
        ({"hidden_size": -64}, "hidden_size"),
        ({"num_hidden_layers": "six"}, "num_hidden_layers"),
    ],
)
def test_serve_reads_the_model_config_with_the_same_bounds_as_build(fake_env, tmp_path, bad, field):
    from hs_dataset.config import load_card
    from hs_dataset.errors import ModelConfigError

    d = _kimi_dir(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["text_config"].update(bad)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match=field):
        serve.plan_server(load_card("kimi-k25-sglang"), model_path=str(d), staging_dir=str(tmp_path / "st"))


def test_kimi_plan_has_every_capture_flag(fake_env, tmp_path):
    from hs_dataset.config import load_card

    card = load_card("kimi-k25-sglang").with_overrides(sglang={"mechanism": "auto"})  # on 0.5.23: aux_return, as the card says
    plan = serve.plan_server(card, model_path=str(_kimi_dir(tmp_path)), staging_dir=str(tmp_path / "st"))
    argv = plan.argv
    joined = " ".join(argv)
    assert "--tp-size 8" in joined and "--dtype bfloat16" in joined
    assert "--enable-return-aux-hidden-states --speculative-algorithm EAGLE3 --return-aux-hidden-state-layer-ids 2 30 58" in joined
    assert "--disable-radix-cache" in argv and "--disable-prefill-cuda-graph" in argv and "--device" not in argv
    assert argv[:2] == ["-m", "hs_dataset.server_patch.launch"]  # hooks: the launcher, so decode graphs carry one-pass capture
    specs = json.loads(argv[argv.index("--forward-hooks") + 1])
    targets = {s["name"]: s["target_modules"] for s in specs}
    assert targets == {"hs_capture_final": ["language_model.model.norm"], "hs_capture": ["language_model.model"]}
    assert specs[0]["config"]["hf_aux_layer_ids"] == [2, 30, 58] and specs[0]["config"]["sglang_aux_layer_ids"] == [2, 30, 58]
    assert "PYTHONPATH" not in plan.env  # hs_dataset installed in the server env, real sgl_kernel on GPU


@pytest.mark.parametrize("storage, server", [("native", "native"), ("fp8", "fp8"), ("mxfp4", "mxfp4"), ("nf4", "nf4")])
def test_the_card_s_storage_reaches_the_server_hooks(fake_env, tmp_path, storage, server):
    """Encoded storages (fp8, 4-bit) are quantized on the device, so the server must be told, not only the writer."""
    from hs_dataset.config import load_card

    card = load_card("kimi-k25-sglang").with_overrides(shards={"storage": storage})
    plan = serve.plan_server(card, model_path=str(_kimi_dir(tmp_path)), staging_dir=str(tmp_path / "st"))
    specs = json.loads(plan.argv[plan.argv.index("--forward-hooks") + 1])
    for spec in specs:
        if spec["name"].startswith("hs_capture"):
            assert spec["config"].get("storage", "native") == server


def test_tiny_cpu_plan_and_what_older_sources_provide(fake_env, monkeypatch, tmp_path):
    from hs_dataset.config import load_card

    card = load_card("tiny-deepseek-sglang")
    fake_env.update(hs_dataset=False)
    plan = serve.plan_server(card, port=31999, staging_dir=str(tmp_path / "st"))
    assert plan.env["SGLANG_USE_CPU_ENGINE"] == "1" and "cpu_support" in plan.env["PYTHONPATH"]
    specs = json.loads(plan.argv[plan.argv.index("--forward-hooks") + 1])
    assert [s["name"] for s in specs] == ["hs_cpu_mla", "hs_capture_final", "hs_capture"]
    # a release whose source has forward hooks but neither the aux return nor the prefill-graph flag, whatever its number
    fake_env.update(sglang="0.5.23", sglang_dir=fake_sglang(tmp_path / "hooks-only", args=("forward_hooks",), rids=False, eagle3=ALWAYS))
    plan = serve.plan_server(card, staging_dir=str(tmp_path / "st"))
    specs = json.loads(plan.argv[plan.argv.index("--forward-hooks") + 1])
    assert plan.mechanism == "layer_hooks" and "--enable-return-aux-hidden-states" not in plan.argv
    assert {s["target_modules"][0] for s in specs if s["name"].startswith("hs_capture_aux")} == {
        "model.layers.1",
        "model.layers.2",
        "model.layers.3",
    }
    assert "--disable-prefill-cuda-graph" not in plan.argv
    assert "unverified" in plan.support_status  # 0.5.23 with layer_hooks on CPU: no test ran it
    fake_env.update(sglang="0.5.5", sglang_dir=fake_sglang(tmp_path / "no-hooks", args=(), rids=False, eagle3=ALWAYS))
    with pytest.raises(ServeError, match="hs-dataset patch"):
        serve.plan_server(card, staging_dir=str(tmp_path / "st"))
    fake_env.update(sglang="9.9.9", sglang_dir=fake_sglang(tmp_path / "future"))  # a release the table never heard of
    plan = serve.plan_server(card, staging_dir=str(tmp_path / "st"))
    assert plan.mechanism == "aux_return" and plan.support_status.startswith("unverified") and "--disable-prefill-cuda-graph" in plan.argv


def test_the_verified_release_says_which_test_ran_it(fake_env, tmp_path):
    plan = serve.plan_server(_tiny_card(), staging_dir=str(tmp_path / "st"))
    assert plan.support_status.startswith("verified by tests/capture/sglang/test_server.py"), plan.support_status
    assert any("read from the installed source" in n for n in plan.notes)


def test_the_eagle3_ids_follow_the_shift_rule_of_the_source(fake_env, tmp_path):
    from hs_dataset.config import load_card

    card = load_card("kimi-k25-sglang").with_overrides(sglang={"mechanism": "auto"})  # 0.5.23's aux_return, as the card says
    fake_env.update(sglang_dir=fake_sglang(tmp_path / "always", eagle3=ALWAYS))
    plan = serve.plan_server(card, model_path=str(_kimi_dir(tmp_path)), staging_dir=str(tmp_path / "st"))
    assert "--return-aux-hidden-state-layer-ids 1 29 57" in " ".join(plan.argv)


def test_unexpressible_layer_ids_are_refused_before_starting(fake_env, tmp_path):
    from hs_dataset.config import load_card

    card = load_card("tiny-deepseek-sglang").with_overrides(layers={"aux": [1, 2]})
    with pytest.raises(ServeError, match="start with 1"):
        serve.plan_server(card, staging_dir=str(tmp_path / "st"))


@pytest.mark.parametrize("mechanism", ["auto", "layer_hooks"])
def test_a_final_state_only_card_plans_no_aux_flag_and_no_layer_hook(fake_env, tmp_path, mechanism):
    from hs_dataset.config import load_card

    card = load_card("tiny-deepseek-sglang").with_overrides(layers={"aux": None, "preset": "mtp"}, sglang={"mechanism": mechanism})
    plan = serve.plan_server(card, staging_dir=str(tmp_path / "st"))
    assert plan.hf_aux_layer_ids == [] and plan.sglang_aux_layer_ids is None
    assert "--enable-return-aux-hidden-states" not in plan.argv and "--return-aux-hidden-state-layer-ids" not in plan.argv
    specs = json.loads(plan.argv[plan.argv.index("--forward-hooks") + 1])
    assert [s["name"] for s in specs] == ["hs_cpu_mla", "hs_capture_final", "hs_capture"]
    assert all(s["config"]["hf_aux_layer_ids"] == [] for s in specs if s["name"].startswith("hs_capture"))
    assert any("final state only" in note for note in plan.notes)


def test_mixed_chunked_prefill_is_planned_with_the_measured_warning(fake_env, tmp_path):
    """A regeneration server with --enable-mixed-chunk loses its decode graphs: serve says so, citing the measurement."""
    from hs_dataset.config import load_card

    card = load_card("tiny-deepseek-sglang")
    plain = serve.plan_server(card, staging_dir=str(tmp_path / "a"))
    assert not any("--enable-mixed-chunk" in note for note in plain.notes)
    mixed = serve.plan_server(card, staging_dir=str(tmp_path / "b"), extra_args=["--enable-mixed-chunk"])
    assert "--enable-mixed-chunk" in mixed.argv, "the flag is the user's to pass: planned as asked"
    warned = [note for note in mixed.notes if note.startswith("--enable-mixed-chunk")]
    assert warned and "3.4x slower" in warned[0] and "docs/GPU.md" in warned[0]
    assert "note: --enable-mixed-chunk" in mixed.describe()


def test_serve_check_cli(fake_env, capsys):
    from hs_dataset.cli.main import main

    assert main(["serve", "--config", "tiny-deepseek-sglang", "--check", "--port", "31998", "--", "--log-level", "warning"]) == 0
    out = capsys.readouterr().out
    assert "mechanism: aux_return" in out and "--log-level warning" in out and "--port 31998" in out


# ---------------------------------------------------------------------------- CPU ranks: one core range each


@pytest.mark.parametrize(
    "cores, ranks, expected",
    [
        ([0, 1], 2, "0|1"),
        ([0, 1, 2, 3, 4, 5, 6, 7], 2, "0-3|4-7"),
        ([0, 1, 2, 3, 4, 5, 6], 3, "0-2|3-4|5-6"),  # sizes differ by at most one, every core used once
        ([2, 3, 8, 9, 10], 2, "2-3,8|9-10"),  # a narrowed affinity mask (taskset, containers)
        ([5, 1, 1, 3], 1, "1,3,5"),
    ],
)
def test_core_split_is_disjoint_and_covers_the_usable_cores(cores, ranks, expected):
    from hs_dataset.capture.serve import cpu_ranks

    groups = cpu_ranks.split_cores(cores, ranks)
    assert cpu_ranks.format_bind(groups) == expected
    assert sorted(c for g in groups for c in g) == sorted(set(cores)) and all(groups)


def test_core_split_refuses_more_ranks_than_cores():
    from hs_dataset.capture.serve import cpu_ranks

    with pytest.raises(ValueError, match="3 cores cannot give 4 ranks"):
        cpu_ranks.split_cores([0, 1, 2], 4)


@pytest.mark.parametrize(
    "argv, ranks",
    [
        (["--tp-size", "2"], 2),
        (["--tp-size", "2", "--dp-size", "2"], 4),  # two replicas of two TP ranks
        (["--tp-size", "2", "--dp", "2", "--enable-dp-attention"], 2),  # DP groups partition the TP ranks
        (["--tp=4", "--pp-size", "2"], 8),
        (["--tp-size", "1", "--tensor-parallel-size", "2"], 2),  # the last one wins, as in argparse
        (["--model-path", "m", "--forward-hooks", "[]"], 1),
    ],
)
def test_cpu_rank_count_reads_sglang_flags(argv, ranks):
    from hs_dataset.capture.serve import cpu_ranks

    assert cpu_ranks.cpu_rank_count(argv) == ranks


def _tiny_card(**sglang):
    from hs_dataset.config import load_card

    return load_card("tiny-deepseek-sglang").with_overrides(sglang=sglang) if sglang else load_card("tiny-deepseek-sglang")


def test_multi_rank_cpu_plan_binds_one_core_range_per_rank(fake_env, monkeypatch, tmp_path):
    from hs_dataset.capture.serve import cpu_ranks

    monkeypatch.delenv(cpu_ranks.OMP_BIND_ENV, raising=False)
    monkeypatch.setattr(cpu_ranks, "usable_cores", lambda: [0, 1, 2, 3])
    assert cpu_ranks.OMP_BIND_ENV not in serve.plan_server(_tiny_card(), staging_dir=str(tmp_path / "st")).env  # one rank
    plan = serve.plan_server(_tiny_card(tp=2), staging_dir=str(tmp_path / "st"))
    assert plan.env[cpu_ranks.OMP_BIND_ENV] == "0-1|2-3" and "--tp-size 2" in " ".join(plan.argv)
    dp = _tiny_card(tp=2, args=["--dp-size", "2", "--enable-dp-attention"])
    assert serve.plan_server(dp, staging_dir=str(tmp_path / "st")).env[cpu_ranks.OMP_BIND_ENV] == "0-1|2-3"
    replicas = _tiny_card(tp=2, args=["--dp-size", "2"])
    assert serve.plan_server(replicas, staging_dir=str(tmp_path / "st")).env[cpu_ranks.OMP_BIND_ENV] == "0|1|2|3"


def test_a_bind_from_the_card_or_the_environment_is_kept(fake_env, monkeypatch, tmp_path):
    from hs_dataset.capture.serve import cpu_ranks

    monkeypatch.delenv(cpu_ranks.OMP_BIND_ENV, raising=False)
    card = _tiny_card(tp=2, env={cpu_ranks.OMP_BIND_ENV: "0-7|8-15"})
    plan = serve.plan_server(card, staging_dir=str(tmp_path / "st"))
    assert plan.env[cpu_ranks.OMP_BIND_ENV] == "0-7|8-15" and any("kept from the card" in n for n in plan.notes)
    monkeypatch.setenv(cpu_ranks.OMP_BIND_ENV, "1|0")
    plan = serve.plan_server(_tiny_card(tp=2), staging_dir=str(tmp_path / "st"))
    assert cpu_ranks.OMP_BIND_ENV not in plan.env and any("kept from the environment" in n for n in plan.notes)


def test_fewer_usable_cores_than_ranks_is_refused(fake_env, monkeypatch, tmp_path):
    from hs_dataset.capture.serve import cpu_ranks

    monkeypatch.delenv(cpu_ranks.OMP_BIND_ENV, raising=False)
    monkeypatch.setattr(cpu_ranks, "usable_cores", lambda: [0, 1])
    card = _tiny_card(tp=2, args=["--pp-size", "2"])
    with pytest.raises(
        ServeError, match=r"tiny-deepseek-sglang.*runs 4 ranks.*only 2 core\(s\).*sglang.tp.*sglang.env.SGLANG_CPU_OMP_THREADS_BIND"
    ):
        serve.plan_server(card, staging_dir=str(tmp_path / "st"))


NEW_LAYER_TP = (
    "from sglang.srt.layers.layer_boundary import LayerBoundary\n"
    "class DeepseekV2DecoderLayer:\n    def forward(self, positions, hidden_states, forward_batch):\n"
    "        return (hidden_states, topk_indices)\n"
)


@pytest.mark.parametrize("tp", [1, 2])
def test_layer_hooks_under_tp_names_the_partial_sum_and_aux_return(fake_env, tmp_path, tp):
    """0.5.23's layers defer the TP all-reduce (an OwedOutput): the refusal says so under TP, never 'CUDA graph'."""
    fake_env.update(sglang_dir=fake_sglang(tmp_path / "new", NEW_LAYER_TP))
    with pytest.raises(ServeError) as err:
        serve.plan_server(_tiny_card(tp=tp, mechanism="layer_hooks"), staging_dir=str(tmp_path / "st"))
    msg = str(err.value)
    assert "returns `(hidden_states, topk_indices)`" in msg and "'aux_return'" in msg and "CUDA graph" not in msg
    assert ("tp 2" in msg and "OwedOutput" in msg and "un-reduced partial sum" in msg) == (tp == 2), msg


def test_the_flagship_card_takes_the_route_a_gpu_run_took(fake_env, tmp_path):
    """kimi-k25-sglang asks for layer_hooks (SGLang 0.5.16 on the H200): forward hooks on the aux layers and the norm."""
    from hs_dataset.config import load_card

    plan = serve.plan_server(load_card("kimi-k25-sglang"), model_path=str(_kimi_dir(tmp_path)), staging_dir=str(tmp_path / "st"))
    specs = json.loads(plan.argv[plan.argv.index("--forward-hooks") + 1])
    assert plan.mechanism == "layer_hooks" and "--enable-return-aux-hidden-states" not in plan.argv
    assert {t for s in specs for t in s["target_modules"]} >= {
        "language_model.model.layers.1",
        "language_model.model.layers.29",
        "language_model.model.layers.57",
        "language_model.model.norm",
    }


def test_a_longest_sample_the_pools_cannot_hold_is_refused_before_starting(fake_env, tmp_path):
    """32k tokens of Kimi-K2.5's 4 states in bf16 fit the default 2 GiB pinned pool; 5 taps do not: refused, naming the setting."""
    from hs_dataset.config import load_card

    card = load_card("kimi-k25-sglang").with_overrides(max_length=32768)
    kimi = str(_kimi_dir(tmp_path))
    base = {"staging": {"pinned_pool_bytes": None}}
    plan = serve.plan_server(card, model_path=kimi, staging_dir=str(tmp_path / "st"), sglang_overrides=base)
    assert plan.hook_config["hf_aux_layer_ids"] == [2, 30, 58]
    wider = card.with_overrides(layers={"aux": [2, 16, 30, 44, 58]})
    with pytest.raises(
        ServeError, match=r"max_length 32768 .* 2\.62 GiB .* raise sglang\.staging\.pinned_pool_bytes to at least 2818572288"
    ):
        serve.plan_server(wider, model_path=kimi, staging_dir=str(tmp_path / "st"), sglang_overrides=base)
    nf4 = wider.with_overrides(shards={"storage": "nf4"})  # a quarter of the bytes: fits again
    assert serve.plan_server(nf4, model_path=kimi, staging_dir=str(tmp_path / "st"), sglang_overrides=base).mechanism
    with pytest.raises(ServeError, match=r"sglang\.staging\.max_bytes"):
        serve.plan_server(card, model_path=kimi, staging_dir=str(tmp_path / "st"), sglang_overrides={"staging": {"max_bytes": 1 << 30}})


def test_the_sizing_defaults_are_the_capture_config_s():
    from hs_dataset.capture.serve.sizing import DEFAULT_PINNED_POOL_BYTES, DEFAULT_STAGING_BYTES
    from hs_dataset.server_patch.config import CaptureConfig

    assert CaptureConfig(staging_dir="x", hf_aux_layer_ids=(1,)).pinned_pool_bytes == DEFAULT_PINNED_POOL_BYTES
    assert CaptureConfig(staging_dir="x", hf_aux_layer_ids=(1,)).max_staging_bytes == DEFAULT_STAGING_BYTES


def test_weights_are_checked_unless_the_server_loads_none(fake_env, tmp_path):
    """A snapshot holding only its final norm is refused, unless the server is told `--load-format dummy` (a rehearsal)."""
    import torch
    from safetensors.torch import save_file

    from hs_dataset.config import load_card
    from hs_dataset.errors import ModelConfigError

    d = _kimi_dir(tmp_path)
    save_file({"language_model.model.norm.weight": torch.ones(7168)}, str(d / "model.safetensors"))
    card = load_card("kimi-k25-sglang")
    with pytest.raises(ModelConfigError):
        serve.plan_server(card, model_path=str(d), staging_dir=str(tmp_path / "st"))
    plan = serve.plan_server(card, model_path=str(d), staging_dir=str(tmp_path / "st"), extra_args=["--load-format", "dummy"])
    assert plan.argv[-2:] == ["--load-format", "dummy"] or "--load-format" in plan.argv

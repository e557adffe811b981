"""End to end on the embedded default: conversations -> tokens -> HF capture -> shards -> verify."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
import torch

from hs_dataset import open_dataset
from hs_dataset.cli.main import main as cli_main
from hs_dataset.formats.verify import verify_dataset
from hs_dataset.pipeline.build import build_dataset

N = 10


@pytest.fixture(scope="module")
def built(tmp_path_factory, hf_backend, tiny_card):
    out = tmp_path_factory.mktemp("pipeline") / "ds"
    report = build_dataset(tiny_card, out, num_samples=N, backend=hf_backend, batch_size=3)
    return out, report


def test_build_writes_a_verified_dataset_with_full_metadata(built, tiny_model_dir):
    out, report = built
    assert report.samples_written == N and not report.capture_failures
    assert verify_dataset(out).ok
    ds = open_dataset(out)
    md = ds.manifest.metadata.to_json()
    assert md["config_name"] == "tiny-deepseek-hf"
    assert md["model"]["path"] == str(tiny_model_dir) and len(md["model"]["fingerprint"]) == 64
    assert md["aux_layer_ids"] == [2, 3, 4] and md["layer_convention"] == "hf_hidden_states_index"
    assert md["final_state"] == "pre_norm" and md["final_norm"]["eps"] == pytest.approx(1e-6)
    assert md["dtype"] == "float32" and md["hidden_size"] == 64 and md["num_hidden_layers"] == 6
    assert md["tokenizer"]["chat_template_sha256"] and md["tokenizer"]["vocab_size"] == 129290
    weight, eps = ds.final_norm()
    assert weight.shape == (64,) and eps == pytest.approx(1e-6)
    runs = json.loads((out / "run_report.json").read_text())["runs"]
    assert runs[-1]["samples_written"] == N


def test_stored_states_equal_a_fresh_independent_forward(built, tiny_model_dir):
    """Recompute from the model directory named in the manifest, without our backend."""
    from transformers import AutoModelForCausalLM

    out, _ = built
    ds = open_dataset(out)
    model = AutoModelForCausalLM.from_pretrained(ds.manifest.metadata.to_json()["model"]["path"], dtype=torch.float32).eval()
    worst = 0.0
    with torch.inference_mode():
        for item in ds:
            hidden = model.model(item["input_ids"][None], output_hidden_states=True).hidden_states
            for k, layer in enumerate(ds.manifest.aux_layer_ids):
                ref = hidden[layer][0]
                worst = max(worst, float((item["aux_hidden_states"][:, k] - ref).norm() / ref.norm()))
            assert item["loss_mask"].any() and not item["loss_mask"].all()
    print(f"max relative error of stored aux states: {worst:.2e}")
    assert worst <= 1e-6


def test_rerun_resumes_instead_of_restarting(built, hf_backend, tiny_card):
    out, _ = built
    report = build_dataset(tiny_card, out, num_samples=N + 2, backend=hf_backend, batch_size=3)
    assert report.skipped_existing == N and report.samples_written == 2
    assert len(open_dataset(out)) == N + 2 and verify_dataset(out).ok


def test_bad_rows_are_counted_in_the_run_report(tmp_path, hf_backend, tiny_card):
    rows = [
        {"id": "ok", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
        {"id": "weird-role", "messages": [{"role": "wizard", "content": "hi"}]},
        {"id": "no-answer", "messages": [{"role": "user", "content": "only a question"}]},
        {"id": "empty", "messages": []},
        {"id": "bad-token", "input_ids": [1, 2, 10_000_000], "loss_mask": [0, 1, 1]},
    ]
    src = tmp_path / "rows.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows))
    report = build_dataset(tiny_card, tmp_path / "ds", source=str(src), backend=hf_backend)
    assert report.samples_written == 1
    kinds = {issue["sample_id"] or issue["row_index"]: issue["kind"] for issue in report.source["issues"]}
    assert len(report.source["issues"]) == 4, report.source["issues"]
    assert "no_supervised_token" in kinds.values() and "malformed" in kinds.values()
    assert "not written          4" in report.summary()


def _crash_build(out, env):
    code = (
        "import sys; from hs_dataset.config import load_card; from hs_dataset.pipeline.build import build_dataset;"
        f"build_dataset(load_card('tiny-deepseek-hf'), sys.argv[1], num_samples={N}, batch_size=2, shard_bytes=40_000)"
    )
    return subprocess.run([sys.executable, "-c", code, str(out)], env=env).returncode


@pytest.fixture(scope="module")
def reference_build(tmp_path_factory):
    import os

    from tests.fixtures.paths import REPO

    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("HS_DATASET_CRASH_AT", None)
    ref = tmp_path_factory.mktemp("reference") / "ds"
    assert _crash_build(ref, env) == 0
    return ref


@pytest.mark.parametrize("point", ["pipeline.after_batch:2", "shard.mid_write:2", "shard.after_publish:1", "manifest.mid_write:3"])
def test_sigkill_mid_build_then_resume_gives_identical_bytes(tmp_path, python_env, reference_build, point):
    ref, crashed = reference_build, tmp_path / "crashed"
    assert _crash_build(crashed, dict(python_env, HS_DATASET_CRASH_AT=point)) == -signal.SIGKILL
    assert _crash_build(crashed, python_env) == 0
    assert verify_dataset(crashed).ok
    a, b = open_dataset(ref), open_dataset(crashed)
    assert sorted(a.sample_ids) == sorted(b.sample_ids) and len(b) == N
    by_id = {item["sample_id"]: item for item in b}
    for item in a:
        other = by_id[item["sample_id"]]
        for key in ("input_ids", "loss_mask", "aux_hidden_states", "final_hidden_state"):
            assert torch.equal(item[key], other[key]), (item["sample_id"], key)


def test_cli_build_verify_info(tmp_path, capsys):
    out = tmp_path / "cli"
    assert (
        cli_main(["build", "--config", "tiny-deepseek-hf", "--out", str(out), "--num-samples", "4", "--batch-size", "2", "--no-progress"])
        == 0
    )
    assert "samples written      4" in capsys.readouterr().out
    assert cli_main(["verify", str(out)]) == 0
    assert capsys.readouterr().out.startswith("verified 4 samples")
    assert cli_main(["info", str(out)]) == 0
    assert "aux layers       [2, 3, 4]" in capsys.readouterr().out


def test_cli_refuses_unknown_config(capsys):
    assert cli_main(["build", "--config", "nope", "--out", "/tmp/never"]) == 2
    assert "unknown config 'nope'" in capsys.readouterr().err

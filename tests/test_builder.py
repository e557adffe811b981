"""The datasets builder: rows carry the states (plain, torch, streaming), cache keys, resume, name lookup."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import zipfile

import datasets
import pytest
import torch

import hs_dataset
from hs_dataset import open_dataset
from hs_dataset.builder import HsDataset
from hs_dataset.sources import bundled_conversations_path
from tests.fixtures.paths import REPO

STATES = ("aux_hidden_states", "final_hidden_state")


def _shards_by_id(cache_dir) -> dict:
    part = next((cache_dir / "hs_dataset_work").glob("*/part-00000-of-00001"))
    return {item["sample_id"]: item for item in open_dataset(part)}


def _assert_row_equals_shards(row: dict, ours: dict) -> None:
    item = ours[row["sample_id"]]
    for key in STATES:
        assert torch.equal(torch.as_tensor(row[key]), item[key].to(torch.float32)), key
    assert torch.equal(torch.as_tensor(row["input_ids"]), item["input_ids"])
    assert torch.equal(torch.as_tensor(row["loss_mask"]), item["loss_mask"].to(torch.bool))


def test_rows_carry_the_states_on_every_path(tmp_path):
    ds = datasets.load_dataset("hs_dataset", config="tiny-deepseek-hf", num_samples=5, cache_dir=str(tmp_path))
    train = ds["train"]
    assert train.num_rows == 5
    assert train.features["aux_hidden_states"].shape == (None, 3, 64) and train.features["final_hidden_state"].shape == (None, 64)
    ours = _shards_by_id(tmp_path)
    for row in train:  # plain python rows
        _assert_row_equals_shards(row, ours)
    torch_rows = train.with_format("torch")
    row = torch_rows[2]
    assert row["aux_hidden_states"].shape == (int(row["seq_len"]), 3, 64) and row["loss_mask"].dtype == torch.bool
    assert int(row["loss_mask"].sum()) == int(row["num_supervised"])
    for row in torch_rows:
        _assert_row_equals_shards(row, ours)
    streamed = datasets.load_dataset(
        "hs_dataset", config="tiny-deepseek-hf", num_samples=5, cache_dir=str(tmp_path), split="train", streaming=True
    )
    seen = [row["sample_id"] for row in streamed]
    assert seen == train["sample_id"]
    for row in streamed.with_format("torch"):
        _assert_row_equals_shards(row, ours)
    # name= is an alias of config=, and a second call reuses the cache
    again = datasets.load_dataset("hs_dataset", name="tiny-deepseek-hf", num_samples=5, cache_dir=str(tmp_path))
    assert again["train"].cache_files == train.cache_files


def test_changed_source_rebuilds(tmp_path):
    lines = bundled_conversations_path().read_text().splitlines(keepends=True)
    source = tmp_path / "chats.jsonl"
    source.write_text("".join(lines[:3]))
    cache = str(tmp_path / "cache")
    first = hs_dataset.load_dataset("tiny-deepseek-hf", source=str(source), cache_dir=cache)
    with open(source, "a") as f:
        f.write(lines[3])
    second = hs_dataset.load_dataset("tiny-deepseek-hf", source=str(source), cache_dir=cache)
    assert (first.num_rows, second.num_rows) == (3, 4)
    assert second["sample_id"][:3] == first["sample_id"]


def test_conflicting_config_and_name_is_refused(tmp_path):
    with pytest.raises(ValueError, match="disagree"):
        HsDataset(config="tiny-deepseek-hf", config_name="kimi-k25-sglang", cache_dir=str(tmp_path))


def test_flagship_config_resolves_without_building(tmp_path):
    builder = datasets.load_dataset_builder("hs_dataset", config="kimi-k25-sglang", cache_dir=str(tmp_path))
    card = builder.config.card
    assert card.aux_layer_ids == [2, 30, 58] and card.final_state == "pre_norm" and card.dtype == "bfloat16"
    assert card.backend.name == "sglang"
    assert not (tmp_path / "hs_dataset_work").exists()


def test_hs_dataset_load_dataset_with_num_proc(tmp_path):
    ds = hs_dataset.load_dataset("tiny-deepseek-hf", num_samples=6, num_proc=2, cache_dir=str(tmp_path))
    assert ds.num_rows == 6 and len(set(ds["sample_id"])) == 6
    parts = sorted((tmp_path / "hs_dataset_work").glob("*/part-*-of-00002"))
    assert len(parts) == 2 and all(len(open_dataset(p)) == 3 for p in parts)
    assert ds[5]["final_hidden_state"].shape[1] == 64


def test_builder_resumes_after_sigkill(tmp_path, python_env):
    code = (
        "import sys, hs_dataset;"
        "hs_dataset.load_dataset('tiny-deepseek-hf', num_samples=8, batch_size=2, shard_bytes=20_000, cache_dir=sys.argv[1])"
    )
    crashed = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], env=dict(python_env, HS_DATASET_CRASH_AT="pipeline.after_batch:3")
    )
    assert crashed.returncode == -signal.SIGKILL
    part = next((tmp_path / "hs_dataset_work").glob("*/part-00000-of-00001"))
    kept = len(open_dataset(part))
    assert kept >= 2  # captured before the kill and not thrown away with datasets' .incomplete dir
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=python_env)
    assert done.returncode == 0
    runs = json.loads((part / "run_report.json").read_text())["runs"]
    # shards published after the last manifest update are adopted on resume, so at least `kept` are reused
    assert runs[-1]["skipped_existing"] >= kept and runs[-1]["skipped_existing"] + runs[-1]["samples_written"] == 8


# ------------------------------------------------------------------ the name, in a fresh interpreter
def _fresh_env() -> dict:
    """The installed package only: no PYTHONPATH, so the startup .pth is what teaches datasets the name."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return dict(env, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


def test_startup_hook_imports_nothing_heavy(tmp_path):
    code = (
        "import sys; from hs_dataset.datasets_hook import _PatchOnImport;"
        "print(any(isinstance(f, _PatchOnImport) for f in sys.meta_path), 'datasets' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_fresh_env(), capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False", "False"], "the hs_dataset_datasets_hook.pth is not installed: run pip install -e ."


@pytest.mark.parametrize("where", ["repo_root", "temp_dir"])
def test_name_lookup_in_a_fresh_interpreter(tmp_path, where):
    cwd = REPO if where == "repo_root" else tmp_path
    code = (
        "import sys, datasets;"
        "ds = datasets.load_dataset('hs_dataset', config='tiny-deepseek-hf', num_samples=3, cache_dir=sys.argv[1], split='train');"
        "print(ds.num_rows, ds.features['aux_hidden_states'].shape)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cache")], cwd=cwd, env=_fresh_env(), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[-2] == "3 (None, 3, 64)"


def test_the_hook_answers_only_for_the_exact_name(tmp_path):
    import datasets.load

    factory = datasets.load.dataset_module_factory
    assert factory("hs_dataset").module_path == "hs_dataset.builder"
    (tmp_path / "hs_dataset").mkdir()
    (tmp_path / "hs_dataset" / "data.jsonl").write_text('{"a": 1}\n')
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert factory("hs_dataset").module_path == "hs_dataset.builder"  # a local folder does not hijack the name
        assert factory("./hs_dataset").module_path != "hs_dataset.builder"  # but is still reachable as a path
        assert factory("hs_dataset", data_files=["data.jsonl"]).module_path != "hs_dataset.builder"
    finally:
        os.chdir(old)


def test_wheels_ship_the_startup_pth(tmp_path):
    """Both a wheel and the editable wheel (pip install -e .) carry the .pth at their root."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    for name in ("hs_dataset", "cards"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for hook in ("build_wheel", "build_editable"):  # one process per hook, as pip does
        code = f"import sys; from setuptools import build_meta as b; b.{hook}(sys.argv[1])"
        done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "dist")], cwd=src, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
    wheels = sorted((tmp_path / "dist").glob("*.whl"))
    assert len(wheels) == 2
    for wheel in wheels:
        names = zipfile.ZipFile(wheel).namelist()
        assert "hs_dataset_datasets_hook.pth" in names, wheel.name
        line = zipfile.ZipFile(wheel).read("hs_dataset_datasets_hook.pth").decode()
        assert line.startswith("import os;") and "HS_DATASET_DATASETS_HOOK" in line and "hs_dataset.datasets_hook" in line

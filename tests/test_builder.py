"""The datasets builder: load_dataset round trips, config aliases, num_proc and resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import datasets
import pytest
import torch

import hs_dataset
from hs_dataset import open_dataset
from hs_dataset.builder import HsDataset


def test_load_dataset_by_name_after_import(tmp_path):
    ds = datasets.load_dataset("hs_dataset", config="tiny-deepseek-hf", num_samples=5, cache_dir=str(tmp_path))
    train = ds["train"]
    assert train.num_rows == 5
    row = train[2]
    assert row["aux_hidden_states"].shape == (row["seq_len"], 3, 64)
    assert row["final_hidden_state"].shape == (row["seq_len"], 64)
    assert row["loss_mask"].dtype == torch.bool and int(row["loss_mask"].sum()) == row["num_supervised"]
    assert torch.equal(row["input_ids"], torch.tensor(train.with_format(None)[2]["input_ids"]))
    # the same bytes our own reader sees, via the shards linked next to the Arrow files
    work = tmp_path / "hs_dataset_work"
    part = next(work.glob("*/part-00000-of-00001"))
    ours = {item["sample_id"]: item for item in open_dataset(part)}
    assert torch.equal(ours[row["sample_id"]]["aux_hidden_states"], row["aux_hidden_states"])
    # name= is an alias of config=, and a second call reuses the cache
    again = datasets.load_dataset("hs_dataset", name="tiny-deepseek-hf", num_samples=5, cache_dir=str(tmp_path))
    assert again["train"][2]["sample_id"] == row["sample_id"]


def test_conflicting_config_and_name_is_refused(tmp_path):
    with pytest.raises(ValueError, match="disagree"):
        HsDataset(config="tiny-deepseek-hf", config_name="kimi-k25-sglang", cache_dir=str(tmp_path))


def test_flagship_config_resolves_without_building(tmp_path):
    builder = datasets.load_dataset_builder("hs_dataset", config="kimi-k25-sglang", cache_dir=str(tmp_path))
    card = builder.config.card
    assert card.aux_layer_ids == [2, 30, 58] and card.final_state == "pre_norm" and card.dtype == "bfloat16"
    assert card.backend["name"] == "sglang"


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
    crashed = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=dict(python_env, HS_DATASET_CRASH_AT="pipeline.after_batch:3"))
    assert crashed.returncode == -signal.SIGKILL
    part = next((tmp_path / "hs_dataset_work").glob("*/part-00000-of-00001"))
    kept = len(open_dataset(part))
    assert kept >= 2  # captured before the kill and not thrown away with datasets' .incomplete dir
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=python_env)
    assert done.returncode == 0
    runs = json.loads((part / "run_report.json").read_text())["runs"]
    # shards published after the last manifest update are adopted on resume, so at least `kept` are reused
    assert runs[-1]["skipped_existing"] >= kept and runs[-1]["skipped_existing"] + runs[-1]["samples_written"] == 8

"""SIGKILL the writer anywhere, resume, and get exactly the uninterrupted dataset."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hs_dataset import open_dataset
from hs_dataset.faults import CRASH_POINTS
from hs_dataset.formats.atomic import TEMP_PREFIX
from hs_dataset.formats.verify import verify_dataset
from tests.fixtures.paths import FIXTURES
from tests.fixtures.samples import make_sample

COUNT, SHARD_BYTES = 120, 30_000
CHILD = FIXTURES / "writer_child.py"


def _run_child(root: Path, env: dict, kill_after: float | None = None) -> int:
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(root), str(COUNT), str(SHARD_BYTES)], env=env, stdout=subprocess.PIPE, text=True
    )
    if kill_after is not None:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(kill_after)
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=120)
    return proc.returncode


def _assert_complete(root: Path) -> None:
    result = verify_dataset(root)
    assert result.ok, result.problems
    ds = open_dataset(root)
    ids = ds.sample_ids
    assert len(ids) == len(set(ids)) == COUNT
    for item in ds:
        i = int(item["sample_id"].split("-")[1])
        ref = make_sample(item["sample_id"], 3 + (i * 7) % 40)
        assert torch.equal(item["aux_hidden_states"], ref.aux_hidden_states)
        assert torch.equal(item["input_ids"], ref.input_ids)
    assert not [n for n in os.listdir(root) if n.startswith(TEMP_PREFIX)]


@pytest.mark.parametrize("point", [p for p in CRASH_POINTS if p.startswith(("shard.", "manifest."))])
@pytest.mark.parametrize("nth", [1, 3])
def test_crash_at_each_point_then_resume(tmp_path, python_env, point, nth):
    env = dict(python_env, HS_DATASET_CRASH_AT=f"{point}:{nth}")
    assert _run_child(tmp_path, env) == -signal.SIGKILL
    assert _run_child(tmp_path, python_env) == 0
    _assert_complete(tmp_path)


def test_random_sigkills_then_resume(tmp_path, python_env):
    rng = random.Random(7)
    kills = 0
    for _ in range(6):
        code = _run_child(tmp_path, python_env, kill_after=rng.uniform(0.0, 0.4))
        kills += code == -signal.SIGKILL
    assert _run_child(tmp_path, python_env) == 0
    _assert_complete(tmp_path)
    assert kills >= 3

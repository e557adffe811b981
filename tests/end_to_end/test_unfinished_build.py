"""A real build killed at a random point: verify and info say it is unfinished, push refuses it, the same command finishes it.

The build is the command line a person runs (``python -m hs_dataset.cli.main build``,
relative ``--out``), killed with SIGKILL at a crash point of :mod:`hs_dataset.faults`
chosen at random (a failure names it and its seed; ``HS_DATASET_TEST_SEED`` replays one), then
stopped with SIGTERM and Ctrl-C (SIGINT) to check what the interrupt says.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hs_dataset.cli.main import main
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest
from tests.fixtures.samples import child_env

N = 12
BUILD = ["build", "--config", "tiny-deepseek-hf", "--out", "out/killed", "--num-samples", str(N), "--batch-size", "2"]
BUILD += ["--shard-bytes", "40000", "--no-progress"]  # about one sample per shard: many kill points
COMMAND = "hs-dataset " + " ".join(BUILD)
# points a 12-sample build reaches at least this often (the first manifest write creates the dataset: count 2 on)
KILL_POINTS = {
    "pipeline.after_batch": 4,
    "shard.mid_write": 6,
    "shard.before_publish": 6,
    "shard.after_publish": 6,
    "manifest.mid_write": 6,
}


def _cli(cwd: Path, argv: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hs_dataset.cli.main", *argv], cwd=cwd, env=dict(child_env(), **env), capture_output=True, text=True
    )


def _random_kill_point() -> tuple[str, str]:
    """``point:count`` for HS_DATASET_CRASH_AT, and how a failure names it (with the seed that replays it)."""
    seed = int(os.environ.get("HS_DATASET_TEST_SEED") or random.randrange(2**31))
    rng = random.Random(seed)
    point = rng.choice(sorted(KILL_POINTS))
    spec = f"{point}:{rng.randint(2 if point == 'manifest.mid_write' else 1, KILL_POINTS[point])}"
    return spec, f"killed at {spec} (HS_DATASET_TEST_SEED={seed})"


def test_killed_build_is_unfinished_until_the_same_command_resumes_it(tmp_path, monkeypatch, capsys, standin):
    spec, why = _random_kill_point()
    killed = _cli(tmp_path, BUILD, HS_DATASET_CRASH_AT=spec)
    assert killed.returncode == -signal.SIGKILL, (why, killed.stderr)
    monkeypatch.chdir(tmp_path)  # where the build ran: the command is printed as it was typed
    stored = Manifest.load(Path("out/killed")).num_samples
    line = f"unfinished build: {stored} of {N} samples stored in out/killed; re-run the same command to resume: {COMMAND}"

    assert main(["verify", "out/killed"]) == 1
    out, err = capsys.readouterr()
    assert err.splitlines()[0] == f"error: {line} (or pass --allow-incomplete to verify it as it is)", (why, err)
    assert main(["verify", "out/killed", "--allow-incomplete"]) == 0, (why, capsys.readouterr())
    out = capsys.readouterr().out
    assert out.splitlines()[0] == line and out.splitlines()[-1].startswith(f"verified {stored} samples")
    assert main(["info", "out/killed"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == line

    push = ["push", "out/killed", "me/killed", "--endpoint", standin.url, "--no-plots"]
    assert main(push) == 2
    assert f"out/killed: unfinished build ({stored} of {N} samples stored;" in capsys.readouterr().err
    assert main([*push, "--allow-incomplete"]) == 0
    capsys.readouterr()

    resumed = _cli(tmp_path, BUILD)
    assert resumed.returncode == 0, (why, resumed.stderr)
    assert main(["verify", "out/killed"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith(f"verified {N} samples")
    assert main(["info", "out/killed"]) == 0
    info = capsys.readouterr().out
    assert "unfinished" not in info and f"build            finished ({COMMAND})" in info


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_build_says_what_it_stored_and_how_to_resume(tmp_path, signum):
    argv = [*BUILD[:4], "out/stopped", "--num-samples", "40", *BUILD[7:]]
    proc = subprocess.Popen(
        [sys.executable, "-m", "hs_dataset.cli.main", *argv],
        cwd=tmp_path,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    manifest = tmp_path / "out" / "stopped" / MANIFEST_NAME
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if manifest.exists() and Manifest.load(manifest.parent).num_samples > 0:
            break
        time.sleep(0.05)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    stored = Manifest.load(manifest.parent).num_samples
    assert stored > 0
    command = "hs-dataset " + " ".join(argv)
    wanted = f"hs-dataset build: error: interrupted: {stored} of 40 samples stored; re-run the same command to resume: {command}"
    assert err.strip().splitlines()[-1] == wanted, err
    assert "Traceback" not in err
    assert re.search(r"unfinished build", _cli(tmp_path, ["verify", "out/stopped"]).stderr)

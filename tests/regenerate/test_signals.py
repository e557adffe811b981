"""SIGINT and SIGTERM during ``hs-dataset build --regenerate`` on the REAL SGLang server (issue 47, never tried before).

The build is the command line a person runs, with ``regenerate.capture`` set by a card
file: ``prefill`` (each finished conversation is sent back for capture) or ``one_pass``
(states kept while the server generates). It runs against the shared CPU capture server
(``capture_server``, the session's: no server of its own) and is stopped by Ctrl-C
(SIGINT) or ``kill`` (SIGTERM) once conversations are stored and others are in flight.
What must hold: exit status 2 and one last line saying how many samples are stored and
the command that resumes (``cli/signals.py``, the error boundary), no traceback; the
manifest records the build as unfinished (``formats/build_state.py``); every stored
regeneration record is a whole conversation and the file has no torn line; the same
command again finishes, and the dataset verifies with every conversation once, each
sample the ids of its stored record. Needs ``.sglang-venv``, like the other real-server tests.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import hs_dataset
from hs_dataset.cli.main import main as cli_main
from hs_dataset.config import load_card
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest
from hs_dataset.formats.regenerated import RegeneratedStore
from tests.fixtures.chat_rows import multi_turn_chats
from tests.fixtures.paths import REPO
from tests.fixtures.sglang_server import staged_files

pytestmark = pytest.mark.sglang

NEW_TOKENS = 8


def conversations() -> list[dict]:
    """16 chats of 1 to 3 user turns, each answered (the answers are rewritten)."""
    return multi_turn_chats(16)


@pytest.fixture(scope="module")
def chats(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("regen-signals-src") / "chats.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in conversations()))
    return path


@pytest.fixture(scope="module", params=["prefill", "one_pass"])
def card_file(request, tmp_path_factory, tiny_model) -> tuple[str, Path]:
    """The shipped tiny SGLang card with ``regenerate.capture`` set, as a card file the command line names."""
    raw = yaml.safe_load((REPO / load_card("tiny-deepseek-sglang").source_path).read_text())
    raw["name"] = f"tiny-deepseek-sglang-{request.param.replace('_', '-')}"
    raw["model"]["path"] = tiny_model
    raw["regenerate"] = {"capture": request.param, "concurrency": 2}
    path = tmp_path_factory.mktemp("regen-signals-card") / f"{raw['name']}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return request.param, path


def build_argv(card: Path, chats: Path, server: str) -> list[str]:
    return [
        "build", "--config", str(card), "--regenerate", "--source", str(chats), "--out", "out/regen",
        "--server", server, "--max-new-tokens", str(NEW_TOKENS), "--thinking", "off", "--batch-size", "2",
        "--shard-bytes", "20000", "--no-progress",
    ]  # fmt: skip


def cli(argv: list[str], cwd: Path, python_env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "hs_dataset.cli.main", *argv],
        cwd=cwd,
        env=python_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_a_stored_sample(proc: subprocess.Popen, out: Path, timeout_s: float = 120) -> None:
    """Until a line of finished conversations is in regenerated.jsonl and a sample in a shard (others are in flight then)."""
    stored = out / "regenerated.jsonl"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if stored.exists() and stored.read_bytes().count(b"\n") >= 1 and _samples(out) > 0:
            return
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"HANG: no sample stored within {timeout_s} s: {proc.communicate()[1][-3000:]}")


def _samples(out: Path) -> int:
    try:
        return Manifest.load(out).num_samples
    except (OSError, ValueError):  # not written yet (or being replaced: read again)
        return 0


@pytest.mark.parametrize(
    "signals", [[signal.SIGINT], [signal.SIGTERM], [signal.SIGINT, signal.SIGINT]], ids=["SIGINT", "SIGTERM", "SIGINT-twice"]
)
def test_a_regenerating_build_stopped_by_a_signal_says_so_and_resumes(
    card_file, chats, capture_server, python_env, tmp_path, capsys, monkeypatch, signals
):
    mode, card = card_file
    argv = build_argv(card, chats, capture_server.url)
    out = tmp_path / "out" / "regen"
    turns = {row["id"]: len(row["messages"]) // 2 for row in conversations()}
    started = time.monotonic()
    proc = cli(argv, tmp_path, python_env)
    wait_for_a_stored_sample(proc, out)
    for k, signum in enumerate(signals):  # twice: a user pressing Ctrl-C again while the build stops
        time.sleep(0.3 * k)
        proc.send_signal(signum)
    try:
        _stdout, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"HANG: the build did not stop within 60 s of {signum.name}: {proc.communicate()[1][-3000:]}") from None
    stopped = time.monotonic() - started

    assert proc.returncode == 2, f"ESCAPE: exit {proc.returncode} after {signum.name}: {err[-3000:]}"
    assert "Traceback" not in err, f"ESCAPE: a traceback after {signum.name}: {err[-3000:]}"
    manifest = Manifest.load(out)
    samples = manifest.num_samples
    command = "hs-dataset " + " ".join(argv)
    wanted = f"hs-dataset build: error: interrupted: {samples} of {len(turns)} samples stored; re-run the same command to resume: {command}"
    assert err.strip().splitlines()[-1] == wanted, err[-3000:]
    assert manifest.build is not None and manifest.build.state == "running", "SILENT: the stopped build is not recorded unfinished"
    monkeypatch.chdir(tmp_path)
    assert cli_main(["verify", "out/regen"]) == 1
    assert capsys.readouterr().err.splitlines()[0].startswith(f"error: unfinished build: {samples} of {len(turns)} samples stored")
    raw = (out / "regenerated.jsonl").read_bytes()
    assert raw.endswith(b"\n"), "SILENT: the interrupted build left a torn line of conversations"
    stored = RegeneratedStore(out).records
    assert 0 < len(stored) < len(turns), f"the signal came after every conversation was stored ({len(stored)})"
    for sid, record in stored.items():
        assert len(record["turns"]) == turns[sid] and record["input_ids"], f"SILENT: half a conversation stored: {sid}"

    resumed = cli(argv, tmp_path, python_env)
    _stdout, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    assert cli_main(["verify", "out/regen"]) == 0, capsys.readouterr()
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"verified {len(turns)} samples")
    final = RegeneratedStore(out).records
    assert sorted(final) == sorted(turns) and all(final[sid] == record for sid, record in stored.items()), "a stored record changed"
    data = hs_dataset.open_dataset(out)
    assert sorted(data.sample_ids) == sorted(turns), "LOST: a conversation is missing or stored twice after the resume"
    for item in data:
        assert item["input_ids"].tolist() == final[item["sample_id"]]["input_ids"], item["sample_id"]
    one_pass = sum(s.get("captured_by", {}).get("one_pass", 0) for s in json.loads((out / MANIFEST_NAME).read_text())["shards"])
    assert (one_pass > 0) == (mode == "one_pass"), f"{mode}: {one_pass} samples captured in one pass"
    leftovers = staged_files(capture_server.staging_dir)
    # the stopped client's one-pass pieces written after its close() cleared them: left, as after a kill -9, until the
    # server's orphan sweeper (orphan_ttl_s) takes them; the shared server's later tests must not see them
    for name in leftovers:
        (Path(capture_server.staging_dir) / name).unlink(missing_ok=True)
    print(
        f"\n{mode}, {'+'.join(sig.name for sig in signals)}: stopped after {stopped:.1f} s with {len(stored)} conversations and {samples} samples stored; "
        f"{len(leftovers)} dumps left in the server's staging dir"
    )

"""Every long command shows its progress in a log file: plain lines at the interval, counts that only grow, a final line.

The commands run with stdout and stderr sent to a file (not a terminal), as under nohup
or SLURM: the build in a child process exactly as a person runs it (``> log.txt 2>&1``),
the others through ``main`` with ``sys.stdout``/``sys.stderr`` replaced by the file.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hs_dataset.cli.main import main
from tests.fixtures.samples import child_env

INTERVAL = "0.02"
END = r"(?:ETA (?:\?|\d+[hms]\d*[ms]?)|done in \S+|stopped after \S+)"
LINE = re.compile(
    r"^(?P<name>[a-z]+): (?P<done>\d+)(?:/(?P<total>\d+))? (?P<unit>[a-z]+)(?P<middle>(?:, (?:[^,]|,(?=\d))+)*?), " + END + "$"
)
SIZE = re.compile(r"(?P<n>[\d.]+) (?P<u>B|KiB|MiB|GiB) (?:written|read|linked|uploaded)")
OPEN = re.compile(r"\(open shard (?P<n>[\d.]+) (?P<u>B|KiB|MiB|GiB)\)")


def progress_lines(log: str, name: str) -> list[re.Match[str]]:
    """The task's lines, each checked: plain text on one line, done counts that never go down, one final line last."""
    raw = [text for text in log.splitlines() if text.startswith(f"{name}: ")]
    assert raw, f"no {name!r} progress line in:\n{log}"
    for text in raw:
        assert "\r" not in text and "\x1b" not in text, text
    matches = [LINE.match(text) for text in raw]
    assert all(matches), [t for t, m in zip(raw, matches) if not m]
    done = [int(m["done"]) for m in matches if m]
    assert done == sorted(done), done
    assert ", done in " in raw[-1] and not any(", done in " in text for text in raw[:-1]), raw
    return [m for m in matches if m]


def nbytes(match: re.Match[str] | None) -> float:
    assert match is not None
    return float(match["n"]) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[match["u"]]


def run_to_file(tmp_path: Path, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """``hs-dataset ARGV`` with its output in a file; returns what the file holds."""
    log = tmp_path / f"{argv[0]}.log"
    with open(log, "w") as f, monkeypatch.context() as patch:
        patch.setattr(sys, "stdout", f)
        patch.setattr(sys, "stderr", f)
        code = main(argv)
    text = log.read_text()
    assert code == 0, text
    return text


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A tiny CPU build run as ``hs-dataset build ... > log.txt 2>&1``: its dataset and its log."""
    root = tmp_path_factory.mktemp("progress")
    out, log = root / "ds", root / "log.txt"
    argv = ["build", "--config", "tiny-deepseek-hf", "--out", str(out), "--num-samples", "6", "--batch-size", "2"]
    with open(log, "w") as f:
        done = subprocess.run(
            [sys.executable, "-m", "hs_dataset.cli.main", *argv, "--progress-interval", INTERVAL],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=child_env(),
            timeout=300,
        )
    text = log.read_text()
    assert done.returncode == 0, text
    return out, text


def test_build_to_a_file_writes_lines_with_the_open_shard_before_any_shard_is_published(built):
    out, log = built
    lines = progress_lines(log, "build")
    assert lines[0]["done"] == "0" and lines[0]["total"] == "6" and lines[-1]["done"] == "6"
    assert any(int(m["done"]) > 0 and "tok/s" in m["middle"] for m in lines)
    # the default shard (1 GiB) is published only at the end: until then every byte counted is the open shard's.
    # Lines once every sample is done are left out: one may fall between the shard's publication and the final line
    # (a CI run on 2026-12-07 caught "6/6 samples, ..., 733.1 KiB written, ETA 0s" there).
    during = [m for m in lines[:-1] if 0 < int(m["done"]) < int(m["total"])]
    assert during and all(nbytes(OPEN.search(m["middle"])) > 0 for m in during)
    assert all(nbytes(SIZE.search(m["middle"])) == nbytes(OPEN.search(m["middle"])) for m in during)
    shard_bytes = sum(s["bytes"] for s in json.loads((out / "manifest.json").read_text())["shards"])
    assert OPEN.search(lines[-1]["middle"]) is None and nbytes(SIZE.search(lines[-1]["middle"])) == pytest.approx(shard_bytes, rel=0.01)


def test_interval_zero_writes_only_the_final_line(built, tmp_path, monkeypatch):
    out, _log = built
    log = run_to_file(tmp_path, ["verify", str(out), "--progress-interval", "0"], monkeypatch)
    (line,) = progress_lines(log, "verify")
    assert line["done"] == line["total"] == "1" and " read" in line["middle"]


def test_no_progress_writes_none(built, tmp_path, monkeypatch):
    out, _log = built
    assert "verify:" not in run_to_file(tmp_path, ["verify", str(out), "--no-progress"], monkeypatch)


def test_the_environment_sets_the_interval(built, tmp_path, monkeypatch):
    out, _log = built
    monkeypatch.setenv("HS_DATASET_PROGRESS_INTERVAL", "0")
    assert len(progress_lines(run_to_file(tmp_path, ["verify", str(out)], monkeypatch), "verify")) == 1
    monkeypatch.setenv("HS_DATASET_PROGRESS_INTERVAL", "3600")
    lines = progress_lines(run_to_file(tmp_path, ["verify", str(out)], monkeypatch), "verify")
    assert [m["done"] for m in lines] == ["0", "1"]  # the opening line, then the final one


def test_export_then_import_show_their_progress(built, tmp_path, monkeypatch):
    out, _log = built
    exported, imported = tmp_path / "spec", tmp_path / "back"
    log = run_to_file(tmp_path, ["export", "speculators", str(out), str(exported), "--progress-interval", INTERVAL], monkeypatch)
    lines = progress_lines(log, "export")
    assert lines[-1]["done"] == lines[-1]["total"] == "6" and nbytes(SIZE.search(lines[-1]["middle"])) > 0
    argv = ["import", "speculators", str(exported), str(imported), "--config", "tiny-deepseek-hf", "--progress-interval", INTERVAL]
    lines = progress_lines(run_to_file(tmp_path, argv, monkeypatch), "import")
    assert lines[-1]["done"] == lines[-1]["total"] == "6" and nbytes(SIZE.search(lines[-1]["middle"])) > 0


def test_merge_shows_the_shards_linked_then_the_verification(built, tmp_path, monkeypatch):
    out, _log = built
    log = run_to_file(tmp_path, ["merge", str(out), str(tmp_path / "merged"), "--progress-interval", INTERVAL], monkeypatch)
    (*_, last) = progress_lines(log, "merge")
    assert last["done"] == last["total"] == "1" and " linked" in last["middle"]
    assert progress_lines(log, "verify")[-1]["done"] == "1"


def test_push_shows_its_commits(built, tmp_path, monkeypatch, standin):
    out, _log = built
    argv = ["push", str(out), "me/progress", "--endpoint", standin.url, "--no-plots", "--no-card", "--progress-interval", INTERVAL]
    (*_, last) = progress_lines(run_to_file(tmp_path, argv, monkeypatch), "push")
    assert last["done"] == last["total"] == "1" and " uploaded" in last["middle"]


def test_build_with_regeneration_shows_both_phases(tmp_path, monkeypatch):
    chats = tmp_path / "chats.jsonl"
    rows = [
        {"id": f"c{i}", "messages": [{"role": "user", "content": f"Say {i}."}, {"role": "assistant", "content": "ok"}]} for i in range(3)
    ]
    chats.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["build", "--config", "tiny-deepseek-hf", "--source", str(chats), "--out", str(tmp_path / "ds"), "--regenerate"]
    argv += ["--max-new-tokens", "4", "--thinking", "off", "--batch-size", "2", "--progress-interval", INTERVAL]
    log = run_to_file(tmp_path, argv, monkeypatch)
    regen = progress_lines(log, "regenerate")
    assert regen[-1]["done"] == regen[-1]["total"] == "3" and "tokens generated" in regen[-1]["middle"]
    assert "3 this run" in regen[-1]["middle"]
    assert progress_lines(log, "build")[-1]["done"] == "3"

"""``hs-dataset repair``: a damaged or missing shard's samples are captured again, equal to an uninterrupted build's, bit for bit.

Real CPU builds of ``tiny-deepseek-hf`` through the command line (in process, so the
states of the repair and of the reference come from the same torch threads): one
reference build; each test repairs a copy of it after damaging one shard (a flipped
byte, a truncation, a deletion), then compares every tensor of every sample by id.
Also: a source that is gone is refused in one line before anything changes; kill -9 in
the middle of a repair leaves a dataset that a re-run repairs; a regenerated dataset is
repaired from its stored conversations, the generator never called.
"""

from __future__ import annotations

import json
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hs_dataset import open_dataset
from hs_dataset.cli.main import main
from hs_dataset.formats.manifest import Manifest
from tests.fixtures.samples import child_env

CHATS = [
    {"id": f"chat-{k}", "messages": [{"role": "user", "content": f"Count to {k}."}, {"role": "assistant", "content": "1 2 3 " * k}]}
    for k in range(1, 7)
]
BUILD = ["--config", "tiny-deepseek-hf", "--batch-size", "2", "--shard-bytes", "30000", "--no-progress"]  # about one sample a shard
REGENERATE = ["--regenerate", "--max-new-tokens", "4", "--thinking", "off"]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("repair-src") / "chats.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in CHATS))
    return path


def _build(out: Path, source: Path, *extra: str) -> Path:
    assert main(["build", *BUILD, "--source", str(source), "--out", str(out), *extra]) == 0
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory, source) -> Path:
    """An uninterrupted build: what every repaired copy must equal."""
    return _build(tmp_path_factory.mktemp("repair-ref") / "ref", source)


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory, source) -> Path:
    return _build(tmp_path_factory.mktemp("repair-regen") / "ref", source, *REGENERATE)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _shard(root: Path, index: int = 1) -> Path:
    return root / Manifest.load(root).shards[index].file


def _flip_byte(root: Path) -> Path:
    shard = _shard(root)
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0x01
    shard.write_bytes(bytes(data))
    return shard


def _truncate(root: Path) -> Path:
    shard = _shard(root)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    return shard


def _delete(root: Path) -> Path:
    shard = _shard(root)
    shard.unlink()
    return shard


def _rows(root: Path) -> dict[str, dict]:
    ds = open_dataset(root, verify_hashes=True)
    return {row["sample_id"]: row for row in (ds[i] for i in range(len(ds)))}


def assert_same_samples(got: Path, want: Path) -> None:
    """Every sample of ``want`` is in ``got`` with bit-identical tensors (compared by sample id)."""
    a, b = _rows(got), _rows(want)
    assert sorted(a) == sorted(b)
    for sid, row in b.items():
        for key, value in row.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(a[sid][key], value), (sid, key)


def _verify_fails_naming_repair(root: Path, capsys, fix: str = "to capture its samples again (same model, card and source)") -> str:
    assert main(["verify", str(root)]) == 1
    err = capsys.readouterr().err
    assert f"run `hs-dataset repair {root}` {fix}" in err, err
    return err


@pytest.mark.parametrize("damage", [_flip_byte, _truncate, _delete], ids=["flipped-byte", "truncated", "deleted"])
def test_repair_recaptures_the_damaged_shard_bit_identical(damage, tmp_path, reference, capsys):
    root = _copy(reference, tmp_path / "ds")
    shard = damage(root)
    samples = Manifest.load(root).shards[1].samples
    _verify_fails_naming_repair(root, capsys)

    assert main(["repair", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"taken out: {shard.name} ({samples} samples)" in out
    assert f"repaired {root}: captured again {samples} sample(s) of {shard.name}, now in shard-" in out
    assert main(["verify", str(root)]) == 0, capsys.readouterr().err
    assert_same_samples(root, reference)
    assert Manifest.load(root).repair is None and not list(root.glob("*.damaged"))


def test_resume_refuses_a_missing_shard_naming_the_repair(tmp_path, reference, source, capsys):
    root = _copy(reference, tmp_path / "ds")
    _delete(root)
    assert main(["build", *BUILD, "--source", str(source), "--out", str(root)]) == 2
    assert f"run `hs-dataset repair {root}` to capture its samples again" in capsys.readouterr().err


def test_repair_of_a_whole_dataset_changes_nothing(tmp_path, reference, capsys):
    root = _copy(reference, tmp_path / "ds")
    before = (root / "manifest.json").read_bytes()
    assert main(["repair", str(root)]) == 0
    assert f"{root}: every shard is whole; nothing to repair" in capsys.readouterr().out
    assert (root / "manifest.json").read_bytes() == before


def test_source_gone_is_refused_in_one_line_before_anything_changes(tmp_path, reference, capsys):
    root = _copy(reference, tmp_path / "ds")
    gone = tmp_path / "moved-away.jsonl"
    raw = json.loads((root / "manifest.json").read_text())
    argv = shlex.split(raw["build"]["command"])
    argv[argv.index("--source") + 1] = str(gone)  # the build read a file that is no longer there
    raw["build"]["command"] = shlex.join(argv)
    (root / "manifest.json").write_text(json.dumps(raw))
    _flip_byte(root)
    before = (root / "manifest.json").read_bytes()

    assert main(["repair", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot repair {root}: its source {gone} is gone" in err[0], err
    assert (root / "manifest.json").read_bytes() == before and not list(root.glob("*.damaged"))


@pytest.mark.parametrize("point", ["repair.after_set_aside", "shard.before_publish:1"])
def test_kill_during_repair_then_repair_again(point, tmp_path, reference, capsys):
    root = _copy(reference, tmp_path / "ds")
    _flip_byte(root)
    argv = [sys.executable, "-m", "hs_dataset.cli.main", "repair", str(root)]
    killed = subprocess.run(argv, env={**child_env(), "HS_DATASET_CRASH_AT": point}, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    # killed before the un-listing: the shard is missing; after it: the manifest's repair record owes its samples
    _verify_fails_naming_repair(root, capsys, "to capture its samples again" if point == "repair.after_set_aside" else "to finish it")

    assert main(["repair", str(root)]) == 0
    assert "repaired" in capsys.readouterr().out
    assert main(["verify", str(root)]) == 0, capsys.readouterr().err
    assert_same_samples(root, reference)


def test_regenerated_dataset_is_repaired_from_its_stored_conversations(tmp_path, regenerated, monkeypatch, capsys):
    from hs_dataset.regenerate.generator import HFGenerator

    def never(self, prompts, params):
        raise AssertionError("the repair generated an answer; it must read the stored conversations back")

    root = _copy(regenerated, tmp_path / "ds")
    stored = (root / "regenerated.jsonl").read_bytes()
    _flip_byte(root)
    _verify_fails_naming_repair(root, capsys)
    monkeypatch.setattr(HFGenerator, "generate", never)

    assert main(["repair", str(root)]) == 0
    assert "repaired" in capsys.readouterr().out
    assert main(["verify", str(root)]) == 0, capsys.readouterr().err
    assert_same_samples(root, regenerated)
    assert (root / "regenerated.jsonl").read_bytes() == stored

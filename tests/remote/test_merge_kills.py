"""kill -9 inside ``hs-dataset merge URL... URL`` (issue 47, never tried before), then the same command again.

Stores are ``file://`` prefixes (the remote merge's code for ``s3://`` too, with copies
through a temp name). The merge runs as a child (``python -m hs_dataset.cli.main merge``)
that SIGKILLs itself at a crash point of :mod:`hs_dataset.faults`: after the n-th shard
copied (``merge.after_copy``) or with everything copied and the manifest not written
(``merge.before_manifest``). What must hold at the kill: a reader of the merged prefix
sees no dataset (a first merge) or the earlier merge whole (a merge again, with a late part
and the parts in another order), never a manifest naming a shard that is missing or holds
other bytes. After the same command again: exit 0, the merge verifies with every part's
samples once, and the parts are byte for byte as they were. Assertion tags: tests/fixtures/tally.py.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hs_dataset
from hs_dataset.cli.main import main as cli_main
from hs_dataset.config.remote import RemoteOptions
from hs_dataset.errors import FormatError
from hs_dataset.formats.manifest import MANIFEST_NAME
from hs_dataset.formats.writer import ShardWriter
from hs_dataset.remote.location import open_location
from hs_dataset.remote.publish import publish_dataset
from hs_dataset.remote.verify import verify_remote
from tests.fixtures.samples import child_env, make_metadata, make_sample
from tests.remote.test_untrusted_stores import tree

PARTS = 3
PER_PART = 4  # samples, two shards of two


def write_part(root: Path, rank: int) -> Path:
    with ShardWriter(root, make_metadata(), final_norm_weight=torch.ones(16), shard_bytes=5_000) as writer:
        for i in range(PER_PART):
            writer.add(make_sample(f"r{rank}-s{i}", 30 + i))
    return root


@pytest.fixture
def bucket(tmp_path, monkeypatch):
    """(parts elsewhere, parts under ds/, the bucket dir): three parts uploaded to both places."""
    monkeypatch.setenv("HS_DATASET_CACHE_DIR", str(tmp_path / "cache"))
    elsewhere, under = [], []
    for rank in range(PARTS):
        local = write_part(tmp_path / f"local{rank}", rank)
        elsewhere.append(f"file://{tmp_path}/bucket/parts/rank{rank}")
        under.append(f"file://{tmp_path}/bucket/ds/rank-{rank:05d}")
        publish_dataset(local, open_location(elsewhere[-1]))
        publish_dataset(local, open_location(under[-1]))
    return elsewhere, under, tmp_path / "bucket"


def merge_killed_at(point: str, parts: list[str], out: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**child_env(), "HS_DATASET_CRASH_AT": point, "HS_DATASET_CACHE_DIR": str(tmp_path / "child-cache")}
    argv = [sys.executable, "-m", "hs_dataset.cli.main", "merge", *parts, out]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)


def reader_sees(url: str, tmp_path: Path) -> str:
    """What a reader of ``url`` sees now: "no dataset", or the merge it verifies (asserting it does)."""
    try:
        result = verify_remote(url, options=RemoteOptions(cache_dir=tmp_path / "reader-cache"))
    except FormatError as exc:
        assert MANIFEST_NAME in str(exc), exc
        return "no dataset"
    assert result.ok, f"LOST: a reader of the merge sees a manifest naming shards that are missing or changed: {result.problems}"
    return f"{result.samples} samples"


def samples_of(url: str, tmp_path: Path) -> list[str]:
    data = hs_dataset.open_dataset(url, cache_dir=tmp_path / "ids-cache", prefetch_shards=0)
    try:
        return sorted(data[i]["sample_id"] for i in range(len(data)))
    finally:
        data.close()


def every_sample(parts: int = PARTS) -> list[str]:
    return sorted(f"r{rank}-s{i}" for rank in range(parts) for i in range(PER_PART))


@pytest.mark.parametrize(
    ("where", "point"),
    [
        ("elsewhere", "merge.after_copy:1"),  # one shard copied
        ("elsewhere", "merge.after_copy:4"),  # the second part half copied
        ("elsewhere", "merge.before_manifest:1"),  # every shard and the norm weight copied
        ("under", "merge.before_manifest:1"),  # parts under the prefix: only the norm weight was copied
    ],
)
def test_a_merge_killed_then_run_again_finishes(bucket, tmp_path, capsys, where, point):
    elsewhere, under, root = bucket
    parts = elsewhere if where == "elsewhere" else under
    out = f"file://{root}/merged" if where == "elsewhere" else f"file://{root}/ds"
    before = tree(root / "parts") | tree(root / "ds")
    killed = merge_killed_at(point, parts, out, tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert reader_sees(out, tmp_path) == "no dataset"

    assert cli_main(["merge", *parts, out]) == 0, f"ESCAPE: the merge run again after a kill at {point} failed: {capsys.readouterr()}"
    assert f"merged {PARTS} parts: verified {PARTS * PER_PART} samples" in capsys.readouterr().out
    assert reader_sees(out, tmp_path) == f"{PARTS * PER_PART} samples"
    assert samples_of(out, tmp_path) == every_sample(), "LOST: a sample is missing or twice after the merge was run again"
    after = tree(root / "parts") | tree(root / "ds")
    assert {k: v for k, v in after.items() if k in before} == before, "LOST: the merge changed a part"


def test_a_merge_again_killed_keeps_the_earlier_merge_whole(bucket, tmp_path, capsys):
    """A late part, the parts in another order: killed mid-copy, a reader still sees the first merge; run again, all of it."""
    elsewhere, _under, root = bucket
    out = f"file://{root}/merged"
    assert cli_main(["merge", *elsewhere[:2], out]) == 0
    capsys.readouterr()
    first = (root / "merged" / MANIFEST_NAME).read_bytes()
    again = [elsewhere[2], elsewhere[1], elsewhere[0]]
    for point in ("merge.after_copy:1", "merge.before_manifest:1"):
        killed = merge_killed_at(point, again, out, tmp_path)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        assert (root / "merged" / MANIFEST_NAME).read_bytes() == first
        assert reader_sees(out, tmp_path) == f"{2 * PER_PART} samples", f"after a kill at {point}"
    assert cli_main(["merge", *again, out]) == 0, capsys.readouterr()
    assert samples_of(out, tmp_path) == every_sample()
    assert not [p for p in (root / "merged").rglob("*") if p.name.startswith(".hs-tmp-")], "a temp copy was left behind"

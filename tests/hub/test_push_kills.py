"""kill -9 inside ``hs-dataset push`` (issue 47, never tried before), then the same push again, against the stand-in Hub.

The push runs as a child (``python -m hs_dataset.cli.main push``, one shard per commit)
killed at five points: by a crash point of :mod:`hs_dataset.faults` (a batch uploaded,
its commit not made: ``push.before_commit``; every shard committed, the manifest's commit
not made: ``push.before_last_commit``), or by the stand-in Hub itself
(``HubStandIn.call_at``) as a request arrives: an LFS upload in flight, a shard commit and
the last commit, which the Hub then applies for a client that is gone. Three repos: a new
one, one holding an earlier push of the same dataset (which grew since), and one holding
an earlier push of another build under the same names (its shards are replaced).

What must hold at every kill: what a reader of the repo sees is no dataset or a manifest
whose every shard is there with the bytes it records (never a manifest naming a missing
or changed shard). After the same push again: the repo holds the local dataset, its
download verifies, and the local directory is byte for byte as it was.
Assertion tags: tests/fixtures/tally.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hs_dataset.formats import ShardWriter
from hs_dataset.formats.hashing import new_hasher
from hs_dataset.formats.manifest import Manifest
from hs_dataset.formats.reader import open_dataset
from hs_dataset.formats.verify import verify_dataset
from hs_dataset.hub.download import download_pushed
from hs_dataset.hub.upload import push_to_hub
from tests.fixtures.samples import make_metadata, make_sample

pytestmark = pytest.mark.filterwarnings("ignore:Use .content=<...>. to upload raw bytes:DeprecationWarning")

CONFIG = "unit-test"
MANIFEST = f"{CONFIG}/hs_shards/manifest.json"
REPO = "me/killed"


def write(root: Path, n: int, *, first: int = 0, seed: int = 0) -> Path:
    """``n`` samples (ids ``first``..) added to ``root``, about one per shard; a directory that exists grows."""
    samples = [make_sample(f"{CONFIG}-{i}", 4 + 3 * (i % 5), seed=seed * 100 + i) for i in range(first, first + n)]
    with ShardWriter(root, make_metadata(config_name=CONFIG), final_norm_weight=torch.ones(16), shard_bytes=1_500) as writer:
        writer.add_many(samples)
    return root


def local_state(root: Path) -> dict[str, tuple[str, int]]:
    """Every file of the local dataset: (sha256, mtime_ns). A push must change none."""
    return {
        str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()
    }


def reader_sees(standin) -> str:
    """What a reader of the repo sees now: "no dataset", or the manifest's samples (every shard it names checked)."""
    if ("dataset", REPO) not in standin.repos:
        return "no dataset"
    files = standin.files(REPO)
    if MANIFEST not in files:
        return "no dataset"
    manifest = Manifest.from_json(json.loads(standin.read(REPO, MANIFEST)), MANIFEST)
    for record in manifest.shards:
        path = f"{CONFIG}/hs_shards/{record.file}"
        assert path in files, f"LOST: a reader sees a manifest naming {path}, which the repo lacks"
        hasher = new_hasher(record.hash_algorithm)
        hasher.update(standin.read(REPO, path))
        assert hasher.hexdigest() == record.digest, f"SILENT: a reader sees a manifest naming {path} with other bytes"
    norm = manifest.metadata.final_norm
    if norm is not None and norm.weight_file:
        assert f"{CONFIG}/hs_shards/{norm.weight_file}" in files, "LOST: the manifest's norm weight is not in the repo"
    return f"{manifest.num_samples} samples"


def push_child(root: Path, standin, tmp_path: Path, crash: str | None = None) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_CACHE": str(tmp_path / "child-cache"),
        "HF_HUB_OFFLINE": "0",
    }
    env.pop("HS_DATASET_CRASH_AT", None)
    if crash:
        env["HS_DATASET_CRASH_AT"] = crash
    argv = [sys.executable, "-m", "hs_dataset.cli.main", "push", str(root), REPO, "--endpoint", standin.url]
    argv += ["--commit-files", "1", "--no-plots", "--no-card"]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def killed_push(root: Path, standin, tmp_path: Path, kill: tuple[str, int]) -> None:
    """Run the push until ``kill`` (a crash point and its count, or a Hub request kind and how many pass first) kills it."""
    what, n = kill
    if "." in what:
        child = push_child(root, standin, tmp_path, f"{what}:{n}")
    else:
        child = None

        def kill_client() -> None:
            os.kill(child.pid, signal.SIGKILL)

        standin.call_at(what, kill_client, after=n)
        child = push_child(root, standin, tmp_path)
    _out, err = child.communicate(timeout=300)
    assert child.returncode == -signal.SIGKILL, f"the push was not killed at {kill}: {err[-3000:]}"


def repo_verifies(api, tmp_path: Path, name: str) -> Manifest:
    """Download the pushed config (every hash checked) and verify it as a local dataset."""
    root, config = download_pushed(REPO, CONFIG, api=api, local_dir=tmp_path / name)
    result = verify_dataset(root / config / "hs_shards")
    assert result.ok, f"LOST: the pushed dataset does not verify: {result.problems}"
    return Manifest.load(root / config / "hs_shards")


def data_files(root: Path) -> int:
    """The push's shard commits: one per shard and one for the norm weight."""
    return len(open_dataset(root).manifest.shards) + 1


KILLS = {
    "lfs-upload-in-flight": ("lfs_upload", 2),  # the third shard's bytes arrive; the Hub stores them
    "batch-uploaded-not-committed": ("push.before_commit", 2),
    "shard-commit-in-flight": ("commit", 1),  # the second shard commit arrives; the Hub applies it
    "shards-committed-manifest-not": ("push.before_last_commit", 1),
    "last-commit-in-flight": ("commit", -1),  # the manifest's commit arrives; the Hub applies it
}


@pytest.mark.parametrize("kill", list(KILLS), ids=list(KILLS))
def test_a_first_push_killed_then_pushed_again(tmp_path, standin, api, kill):
    root = write(tmp_path / "ds", 6)
    before = local_state(root)
    what, n = KILLS[kill]
    killed_push(root, standin, tmp_path, (what, data_files(root) if n < 0 else n))
    seen = reader_sees(standin)
    assert seen == ("6 samples" if kill == "last-commit-in-flight" else "no dataset"), seen
    assert local_state(root) == before, "LOST: the killed push changed the local dataset"

    push_to_hub(root, REPO, api=api, card=False, commit_files=1, plots=False)
    assert reader_sees(standin) == "6 samples"
    assert repo_verifies(api, tmp_path, "dl").dataset_id == open_dataset(root).manifest.dataset_id
    assert local_state(root) == before, "LOST: the push changed the local dataset"


@pytest.mark.parametrize("kill", ["lfs-upload-in-flight", "shards-committed-manifest-not"])
def test_a_push_of_a_grown_dataset_killed_leaves_the_earlier_push_whole(tmp_path, standin, api, kill):
    root = write(tmp_path / "ds", 4)
    push_to_hub(root, REPO, api=api, card=False, commit_files=1, plots=False)
    write(root, 4, first=4)  # the build went on: new shards beside the pushed ones
    before = local_state(root)
    killed_push(root, standin, tmp_path, KILLS[kill])
    assert reader_sees(standin) == "4 samples", "a reader mid-push must see the earlier push whole"
    push_to_hub(root, REPO, api=api, card=False, commit_files=1, plots=False)
    assert reader_sees(standin) == "8 samples"
    assert repo_verifies(api, tmp_path, "dl").num_samples == 8
    assert local_state(root) == before, "LOST: the push changed the local dataset"


@pytest.mark.parametrize("kill", ["batch-uploaded-not-committed", "shard-commit-in-flight"])
def test_a_push_replacing_another_build_killed_never_shows_a_manifest_of_changed_shards(tmp_path, standin, api, kill):
    """A rebuilt dataset (same config, same shard names, other bytes) pushed over the old one: a reader sees the old whole or nothing."""
    push_to_hub(write(tmp_path / "old", 6), REPO, api=api, card=False, commit_files=1, plots=False)
    root = write(tmp_path / "new", 6, seed=7)
    assert {r.file for r in open_dataset(root).manifest.shards} & {r.file for r in open_dataset(tmp_path / "old").manifest.shards}
    before = local_state(root)
    killed_push(root, standin, tmp_path, KILLS[kill])
    assert reader_sees(standin) == "no dataset", "the repo's manifest must be withdrawn before a shard it lists is replaced"
    push_to_hub(root, REPO, api=api, card=False, commit_files=1, plots=False)
    assert repo_verifies(api, tmp_path, "dl").dataset_id == open_dataset(root).manifest.dataset_id
    assert local_state(root) == before, "LOST: the push changed the local dataset"

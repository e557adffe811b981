"""``build --out s3://...`` against a real S3-compatible server (moto's, on 127.0.0.1): ranks as separate processes.

Three ranks write one bucket prefix each (``rank-0000R``), each in its own process forked
from a warm interpreter (tests/fixtures/faults_forkserver.py runs the real command line).
Rank 1 is SIGKILLed halfway through uploading a shard, rank 2 after its shards but before
its manifest, and rank 0's staging directory is deleted after its build (a rank requeued
on another node); each is resumed by running the same command. Then every part lists
exactly its rank's samples, once, and every object's bytes hash to what its manifest
records: samples lost 0, duplicated 0.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from hs_dataset.formats.hashing import new_hasher
from hs_dataset.formats.manifest import Manifest
from hs_dataset.sources import bundled_conversations_path

from tests.fixtures.forkserver_client import ForkServer
from tests.fixtures.paths import REPO

WORLD = 3
SAMPLES = 12
SHARD_BYTES = 150_000  # about one sample per shard: several uploads per rank


@pytest.fixture(scope="module")
def forkserver(s3_server, tmp_path_factory):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("HS_DATASET_CRASH_AT", None)
    server = ForkServer(env, tmp_path_factory.mktemp("forkserver-logs"))
    yield server
    server.close()


def expected_ids(rank: int) -> set[str]:
    rows = [json.loads(line) for line in bundled_conversations_path().read_text().splitlines() if line.strip()][:SAMPLES]
    return {row["id"] for row in rows[rank::WORLD]}


def build_argv(url: str, stage, rank: int) -> list[str]:
    return [
        "build", "--config", "tiny-deepseek-hf", "--out", url, "--stage-dir", str(stage), "--num-samples", str(SAMPLES),
        "--rank", str(rank), "--world-size", str(WORLD), "--shard-bytes", str(SHARD_BYTES), "--batch-size", "2",
        "--device", "cpu", "--no-progress",
    ]


def remote_manifest(fs, key: str) -> Manifest | None:
    fs.invalidate_cache()
    if not fs.exists(f"{key}/manifest.json"):
        return None
    return Manifest.from_json(json.loads(fs.cat_file(f"{key}/manifest.json")), key)


def check_part(fs, key: str, rank: int) -> list[str]:
    """The part lists its rank's samples once each and every listed object holds the recorded bytes; returns its ids."""
    from safetensors import safe_open

    manifest = remote_manifest(fs, key)
    assert manifest is not None, f"{key} has no manifest"
    ids: list[str] = []
    for record in manifest.shards:
        data = fs.cat_file(f"{key}/{record.file}")
        hasher = new_hasher(record.hash_algorithm)
        hasher.update(data)
        assert len(data) == record.bytes and hasher.hexdigest() == record.digest, record.file
        local = f"/tmp/hs-check-{os.getpid()}.safetensors"
        with open(local, "wb") as f:
            f.write(data)
        with safe_open(local, framework="pt") as f:
            ids += json.loads(f.metadata()["sample_ids"])
        os.unlink(local)
    assert sorted(ids) == sorted(expected_ids(rank)), (rank, ids)
    assert not [name for name in fs.ls(key) if os.path.basename(name).startswith(".hs-tmp-")]
    return ids


def test_ranks_write_one_bucket_killed_mid_upload_and_resumed(forkserver, s3_bucket, tmp_path):
    import s3fs

    fs = s3fs.S3FileSystem()
    base = s3_bucket.removeprefix("s3://") + "/ds"
    url = f"{s3_bucket}/ds/rank-{{:05d}}"
    stages = [tmp_path / f"stage-{rank}" for rank in range(WORLD)]

    first = forkserver.run(build_argv(url.format(0), stages[0], 0))
    assert first["returncode"] == 0
    killed = forkserver.run(build_argv(url.format(1), stages[1], 1), crash="remote.mid_upload:2")
    assert killed["returncode"] == -9 and killed["killed_by"] == "crash_point"
    assert remote_manifest(fs, f"{base}/rank-00001") is None  # nothing listed: no reader sees a part-uploaded rank
    killed = forkserver.run(build_argv(url.format(2), stages[2], 2), crash="remote.before_manifest:1")
    assert killed["returncode"] == -9
    assert remote_manifest(fs, f"{base}/rank-00002") is None
    assert len([n for n in fs.ls(f"{base}/rank-00002") if n.endswith(".safetensors") and "rank" in os.path.basename(n)]) >= 2

    for rank in (1, 2):  # the same command resumes: the shards are in the stage, the uploads are redone
        assert forkserver.run(build_argv(url.format(rank), stages[rank], rank))["returncode"] == 0
    before = fs.cat_file(f"{base}/rank-00000/manifest.json")
    shutil.rmtree(stages[0])  # requeued on a node without the staging directory: it is fetched from the bucket
    resumed = forkserver.run(build_argv(url.format(0), stages[0], 0))
    assert resumed["returncode"] == 0
    assert "already stored       4" in open(resumed["log"]).read()
    assert fs.cat_file(f"{base}/rank-00000/manifest.json") == before

    ids = [sid for rank in range(WORLD) for sid in check_part(fs, f"{base}/rank-{rank:05d}", rank)]
    assert len(ids) == len(set(ids)) == SAMPLES  # samples lost 0, duplicated 0

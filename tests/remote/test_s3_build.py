"""``build --out s3://...``, ``merge`` and training from the bucket against a real S3-compatible server (moto's, on 127.0.0.1).

Three ranks write one bucket prefix each (``rank-0000R``), each in its own process forked
from a warm interpreter (tests/fixtures/faults_forkserver.py runs the real command line).
Rank 1 is SIGKILLed halfway through uploading a shard, rank 2 after its shards but before
its manifest, and rank 0's staging directory is deleted after its build (a rank requeued
on another node); each is resumed by running the same command. Then every part lists
exactly its rank's samples, once, and every object's bytes hash to what its manifest
records: samples lost 0, duplicated 0. The parts are merged under their prefix by a
manifest alone (no shard copied, ``verify s3://`` passing), and a trainer in another
process reads the merged dataset from the bucket through the PyTorch training view with
the cache's bound held on disk.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

from hs_dataset.cli.main import main as cli_main
from hs_dataset.formats.hashing import new_hasher
from hs_dataset.formats.manifest import Manifest
from hs_dataset.remote.merge import merge_remote
from hs_dataset.sources import bundled_conversations_path
from tests.fixtures.forkserver_client import ForkServer
from tests.fixtures.paths import REPO
from tests.fixtures.samples import child_env

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
        "build",
        "--config",
        "tiny-deepseek-hf",
        "--out",
        url,
        "--stage-dir",
        str(stage),
        "--num-samples",
        str(SAMPLES),
        "--rank",
        str(rank),
        "--world-size",
        str(WORLD),
        "--shard-bytes",
        str(SHARD_BYTES),
        "--batch-size",
        "2",
        "--device",
        "cpu",
        "--no-progress",
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


@pytest.fixture(scope="module")
def parts(forkserver, s3_server, tmp_path_factory) -> str:
    """The three ranks built into a new bucket, killed mid-upload and resumed; returns the dataset's base URL."""
    import s3fs

    fs = s3fs.S3FileSystem()
    bucket = f"hs-build-{uuid.uuid4().hex[:8]}"
    fs.mkdir(bucket)
    base = f"{bucket}/ds"
    url = f"s3://{base}/rank-{{:05d}}"
    tmp = tmp_path_factory.mktemp("stages")
    stages = [tmp / f"stage-{rank}" for rank in range(WORLD)]

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
    return f"s3://{base}"


def test_ranks_killed_mid_upload_resume_with_no_sample_lost_or_doubled(parts):
    import s3fs

    fs = s3fs.S3FileSystem()
    base = parts.removeprefix("s3://")
    ids = [sid for rank in range(WORLD) for sid in check_part(fs, f"{base}/rank-{rank:05d}", rank)]
    assert len(ids) == len(set(ids)) == SAMPLES  # samples lost 0, duplicated 0


def test_merge_under_the_prefix_copies_no_shard_and_verifies(parts, capsys, monkeypatch, tmp_path):
    import s3fs

    monkeypatch.setenv("HS_DATASET_CACHE_DIR", str(tmp_path / "cache"))
    fs = s3fs.S3FileSystem()
    base = parts.removeprefix("s3://")
    before = set(fs.find(base))
    ranks = [f"{parts}/rank-{rank:05d}" for rank in range(WORLD)]
    assert cli_main(["merge", *ranks, parts]) == 0
    assert f"merged {WORLD} parts: verified {SAMPLES} samples" in capsys.readouterr().out
    fs.invalidate_cache()
    assert set(fs.find(base)) - before == {f"{base}/manifest.json", f"{base}/final_norm.safetensors"}
    merged = remote_manifest(fs, base)
    assert all(record.file.startswith("rank-") for record in merged.shards) and merged.num_samples == SAMPLES
    assert cli_main(["verify", parts]) == 0
    assert cli_main(["merge", *ranks, parts]) == 0  # merging again replaces the merge
    elsewhere = f"s3://{base}-copy"
    assert cli_main(["merge", *ranks, elsewhere]) == 0  # parts elsewhere: copied server-side under part-NNNNN/
    assert all(record.file.startswith("part-") for record in remote_manifest(fs, f"{base}-copy").shards)
    assert cli_main(["merge", *ranks, ranks[0]]) == 2
    assert "is the part" in capsys.readouterr().err


READER = """
import json, sys
import hs_dataset
from hs_dataset.remote.cache import disk_usage
from hs_dataset.training import Eagle3Dataset, PackedCollator
from torch.utils.data import DataLoader

url, cache, bound = sys.argv[1], sys.argv[2], int(sys.argv[3])
view = Eagle3Dataset(hs_dataset.open_dataset(url, cache_dir=cache, max_cache_bytes=bound, prefetch_shards=1))
ids, peak, tokens = [], 0, 0
for batch in DataLoader(view, batch_size=1, collate_fn=PackedCollator(), num_workers=0):
    tokens += int(batch["loss_mask"].numel())
    peak = max(peak, disk_usage(cache))
ids = [view.data[i]["sample_id"] for i in range(len(view))]
print(json.dumps({"ids": ids, "peak": peak, "tokens": tokens}))
"""


def test_a_trainer_in_another_process_reads_the_bucket_within_the_cache_bound(parts, tmp_path):
    import s3fs

    fs = s3fs.S3FileSystem()
    base = parts.removeprefix("s3://")
    if remote_manifest(fs, base) is None:  # run alone (-k): merge here
        merge_remote([f"{parts}/rank-{rank:05d}" for rank in range(WORLD)], parts)
    merged = remote_manifest(fs, base)
    bound = 3 * max(record.bytes for record in merged.shards) + 3 * 4096 + 65536  # 2 open + 1 prefetched, block rounding
    cache = tmp_path / "trainer-cache"
    done = subprocess.run(
        [sys.executable, "-c", READER, parts, str(cache), str(bound)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(seen["ids"]) == sorted(set().union(*(expected_ids(r) for r in range(WORLD))))  # lost 0
    assert 0 < seen["peak"] <= bound, seen
    assert seen["tokens"] == merged.num_tokens - merged.num_samples

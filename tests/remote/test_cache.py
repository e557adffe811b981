"""The bounded shard cache and the upload path, on ``file://`` URLs (the same code as s3://, no server needed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

import hs_dataset
from hs_dataset.errors import IntegrityError, UsageError
from hs_dataset.formats.atomic import TEMP_PREFIX
from hs_dataset.formats.writer import ShardWriter
from hs_dataset.remote.cache import INDEX_NAME, ShardCache, disk_usage
from hs_dataset.remote.location import open_location
from hs_dataset.remote.publish import publish_dataset
from tests.fixtures.samples import make_metadata, make_sample, write_small_dataset


@pytest.fixture
def remote(tmp_path):
    """(location, manifest): 12 samples in 6 shards, published to file://tmp/bucket/ds."""
    local = tmp_path / "local"
    write_small_dataset(local, 12)
    loc = open_location(f"file://{tmp_path}/bucket/ds")
    publish_dataset(local, loc)
    assert not [n for n in os.listdir(tmp_path / "bucket" / "ds") if n.startswith(TEMP_PREFIX)]
    return loc, loc.require_manifest()


def test_file_url_round_trip_and_publish_is_idempotent(remote, tmp_path):
    loc, manifest = remote
    data = hs_dataset.open_dataset(loc.url, cache_dir=tmp_path / "cache", max_cache_bytes=1 << 24)
    assert [row["sample_id"] for row in data] == [f"s{i:02d}" for i in range(12)]
    again = publish_dataset(tmp_path / "local", loc)
    assert again.uploaded == [] and again.already_there == len(manifest.shards)


def test_eviction_keeps_the_bound_and_spares_pinned_shards(remote, tmp_path):
    loc, manifest = remote
    size = max(r.bytes for r in manifest.shards) + 4096
    cache = ShardCache(tmp_path / "cache", 2 * size)
    first = cache.fetch(loc, manifest.shards[0])
    pin = cache.open_pinned(first)
    for record in manifest.shards[1:4]:
        cache.fetch(loc, record)
        assert disk_usage(cache.directory) <= cache.max_bytes
        assert first.exists()  # pinned: the others were evicted instead
    other = subprocess.run(  # another process holding a pin counts the same (flock)
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_SH); print('held')",
            str(first),
        ],
        capture_output=True,
        text=True,
    )
    assert other.stdout.strip() == "held"
    second = cache.fetch(loc, manifest.shards[4])
    pin2 = cache.open_pinned(second)
    with pytest.raises(UsageError, match="cannot hold .* beside the"):
        cache.fetch(loc, manifest.shards[5])  # both slots pinned: refused, never over the bound
    os.close(pin)
    os.close(pin2)
    cache.fetch(loc, manifest.shards[5])
    assert not first.exists() and disk_usage(cache.directory) <= cache.max_bytes


def test_dead_downloads_are_removed_and_old_files_rehashed(remote, tmp_path):
    loc, manifest = remote
    cache = ShardCache(tmp_path / "cache", 1 << 24)
    record = manifest.shards[0]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    stale = cache.directory / f"{TEMP_PREFIX}{dead}-abcd-{cache.path_for(record).name}"
    stale.write_bytes(b"x" * 1000)
    path = cache.fetch(loc, record)  # not taken for a live download of the same shard: removed, then fetched
    assert not stale.exists() and path.exists()
    with open(path, "r+b") as f:  # a file from before the last boot, damaged by the crash
        f.seek(record.bytes - 1)
        f.write(b"\x00" if f.read(1) != b"\x00" else b"\x01")
    os.utime(path, (1, 1))
    assert cache.fetch(loc, record) == path
    assert path.read_bytes() == (tmp_path / "local" / record.file).read_bytes()  # hashed again, refused, downloaded again


def test_a_damaged_object_never_reaches_the_cache(remote, tmp_path):
    loc, manifest = remote
    record = manifest.shards[2]
    target = tmp_path / "bucket" / "ds" / record.file
    raw = bytearray(target.read_bytes())
    raw[100] ^= 1
    target.write_bytes(bytes(raw))
    cache = ShardCache(tmp_path / "cache", 1 << 24)
    with pytest.raises(IntegrityError, match="blake3 .* != recorded"):
        cache.fetch(loc, record)
    assert sorted(os.listdir(cache.directory)) == [INDEX_NAME, ".lock"]  # the cache's own files only: no shard, no temp


def test_staged_upload_uploads_while_the_build_runs_and_resumes_a_lost_stage(tmp_path):
    import time

    from hs_dataset.config.remote import RemoteOptions
    from hs_dataset.remote.destination import staged_upload

    url = f"file://{tmp_path}/bucket/part"
    options = RemoteOptions(cache_dir=tmp_path / "cache", stage_dir=tmp_path / "stage", upload_interval_s=0.1)
    seen_during: list[int] = []

    def build(stage):
        with ShardWriter(stage, make_metadata(), final_norm_weight=torch.ones(16), shard_bytes=1 << 20) as writer:
            for i in range(6):
                writer.add(make_sample(f"s{i}", 20))
                if i % 2 == 1:
                    writer.flush()
                    time.sleep(0.5)
                    manifest = open_location(url).manifest()
                    seen_during.append(0 if manifest is None else manifest.num_samples)
        return "built"

    with staged_upload(url, options) as stage:
        assert build(stage) == "built"
    assert seen_during[-1] >= 2 and seen_during == sorted(seen_during)  # published while the build ran, only growing
    assert open_location(url).require_manifest().num_samples == 6
    shutil.rmtree(tmp_path / "stage")  # requeued elsewhere: the stage is seeded from the store before the build

    def resumed(stage):
        with ShardWriter(stage, make_metadata()) as writer:
            return writer.stored_ids

    with staged_upload(url, options) as stage:
        assert resumed(stage) == {f"s{i}" for i in range(6)}

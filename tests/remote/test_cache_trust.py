"""The remote cache trusts no stat, no clock and no writable cache directory (issue 47).

Untrusted input: whoever may write the cache directory. A cached shard edited in place
with its size and mtime put back must not be served by the next reader (another process,
or a new reader object) and ``verify URL`` must name it; a download temp naming a live
pid with an mtime a day ahead must not block readers; a read-only or full cache
directory is one named error from the Python API, not a raw OSError. Stores are
``file://`` prefixes (the same code as ``s3://``). Assertion tags: tests/fixtures/tally.py.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import hs_dataset
from hs_dataset.config.remote import RemoteOptions
from hs_dataset.errors import DiskFullError, ReadOnlyError
from hs_dataset.formats.atomic import TEMP_PREFIX
from hs_dataset.remote.cache import ShardCache
from hs_dataset.remote.cache_dir import cache_writes
from hs_dataset.remote.follow import follow_dataset
from hs_dataset.remote.location import open_location
from hs_dataset.remote.publish import publish_dataset
from hs_dataset.remote.verify import verify_remote
from tests.fixtures.assertions import one_line
from tests.fixtures.samples import write_small_dataset

_READ = """
import sys, torch, hs_dataset
data = hs_dataset.open_dataset(sys.argv[1], cache_dir=sys.argv[2], prefetch_shards=0)
torch.save([data[i]["aux_hidden_states"] for i in range(data.manifest.shards[0].samples)], sys.argv[3])
"""


@pytest.fixture
def published(tmp_path):
    """(url, local dataset): 8 samples in 4 shards, published to file://tmp/bucket/ds."""
    local = tmp_path / "local"
    write_small_dataset(local)
    url = f"file://{tmp_path}/bucket/ds"
    publish_dataset(local, open_location(url))
    return url, local


def edit_in_place_keeping_size_and_mtime(path: Path) -> None:
    """Flip a byte in the last sample's states, then put the mode and the times back: only the ctime tells."""
    before = os.stat(path)
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(before.st_size - 3)
        byte = f.read(1)
        f.seek(before.st_size - 3)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.chmod(path, 0o444)
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)


def test_a_shard_edited_in_place_with_size_and_mtime_restored_is_never_served(published, tmp_path):
    url, local = published
    cache = tmp_path / "cache"
    here = hs_dataset.open_dataset(local)
    expected = [here[i]["aux_hidden_states"] for i in range(here.manifest.shards[0].samples)]
    first = hs_dataset.open_dataset(url, cache_dir=cache, prefetch_shards=0)
    assert torch.equal(first[0]["aux_hidden_states"], expected[0])
    path = first.cache.path_for(first.manifest.shards[0])
    first.close()
    edit_in_place_keeping_size_and_mtime(path)

    result = verify_remote(url, options=RemoteOptions(cache_dir=cache))
    named = [p for p in result.problems if str(path) in p]
    assert named and "changed after download" in named[0], f"SILENT: verify URL passed an edited cached copy: {result.problems}"

    out = tmp_path / "read.pt"
    child = subprocess.run([sys.executable, "-c", _READ, url, str(cache), str(out)], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr[-2000:]
    for got, want in zip(torch.load(out), expected, strict=True):
        assert torch.equal(got, want), "SILENT: the next process served a cached shard edited in place"
    assert path.read_bytes() == (local / first.manifest.shards[0].file).read_bytes()  # downloaded again

    edit_in_place_keeping_size_and_mtime(path)  # again, now under this process, which checked the file before
    again = hs_dataset.open_dataset(url, cache_dir=cache, prefetch_shards=0)
    for i, want in enumerate(expected):
        assert torch.equal(again[i]["aux_hidden_states"], want), "SILENT: a new reader object served a cached shard edited in place"
    again.close()
    assert verify_remote(url, options=RemoteOptions(cache_dir=cache)).ok


def test_a_download_temp_under_a_live_pid_with_a_future_mtime_does_not_block_readers(published, tmp_path):
    url, local = published
    cache = ShardCache(tmp_path / "cache", 1 << 24)
    record = hs_dataset.open_dataset(local).manifest.shards[0]
    planted = cache.directory / f"{TEMP_PREFIX}{os.getpid()}-0000abcd-{cache.path_for(record).name}"
    planted.write_bytes(b"x" * 100)
    ahead = time.time() + 86400
    os.utime(planted, (ahead, ahead))
    start = time.monotonic()
    data = hs_dataset.open_dataset(url, cache_dir=cache.directory, prefetch_shards=0)
    assert data[0]["sample_id"] == "s00"
    assert time.monotonic() - start < 30, "HANG: readers waited on a temp nobody holds"
    assert not planted.exists()
    data.close()


@pytest.fixture
def unwritable(tmp_path):
    """A cache_dir that cannot be created: under a directory of mode 0o555, or as root (where modes do not bind) under /sys."""
    if os.geteuid() != 0:
        parent = tmp_path / "read-only"
        parent.mkdir()
        parent.chmod(0o555)
        yield parent / "cache"
        parent.chmod(0o755)
        return
    try:
        os.mkdir("/sys/hs-dataset-probe")
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EPERM, errno.EACCES):
            pytest.skip(f"no unwritable directory for root here ({exc})")
    else:
        os.rmdir("/sys/hs-dataset-probe")
        pytest.skip("root may write /sys here: no unwritable directory")
    yield Path("/sys/hs-dataset-cache")


def test_a_cache_dir_that_cannot_be_written_is_a_named_error(published, unwritable):
    url, _local = published
    with pytest.raises(ReadOnlyError) as err:
        hs_dataset.open_dataset(url, cache_dir=unwritable)
    text = one_line(err.value)
    assert text.startswith(f"{unwritable}: cannot write the remote cache") and "HS_DATASET_CACHE_DIR" in text
    with pytest.raises(ReadOnlyError) as err:
        follow_dataset(url, idle_timeout_s=0, cache_dir=unwritable)
    assert one_line(err.value).startswith(f"{unwritable}: cannot write the remote cache")
    with pytest.raises(ReadOnlyError) as err:
        verify_remote(url, options=RemoteOptions(cache_dir=unwritable))  # its private cache goes beside cache_dir
    assert one_line(err.value).startswith(f"{unwritable}: cannot write the remote cache")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes a directory of mode 0o555")
def test_an_existing_cache_made_read_only_is_a_named_error(published, tmp_path):
    url, _local = published
    cache = tmp_path / "cache"
    ShardCache(cache, 1 << 24)
    cache.chmod(0o555)
    try:
        with pytest.raises(ReadOnlyError) as err:
            hs_dataset.open_dataset(url, cache_dir=cache, prefetch_shards=0)[0]
        assert one_line(err.value).startswith(f"{cache}: cannot write the remote cache")
    finally:
        cache.chmod(0o755)


def test_a_full_disk_under_the_cache_is_a_named_error(published, tmp_path, monkeypatch):
    url, _local = published

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("hs_dataset.remote.cache.receive_file", full)
    data = hs_dataset.open_dataset(url, cache_dir=tmp_path / "cache", prefetch_shards=0)
    with pytest.raises(DiskFullError) as err:
        data[0]
    text = one_line(err.value)
    assert text.startswith(f"{tmp_path / 'cache'}: cannot write the remote cache (no space left on the device, ENOSPC)")
    assert "free space there" in text
    data.close()


def test_cache_writes_leaves_other_errors_alone(tmp_path):
    with pytest.raises(ConnectionResetError), cache_writes(tmp_path):
        raise ConnectionResetError(errno.ECONNRESET, "reset")

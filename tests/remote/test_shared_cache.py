"""A remote cache two users share (issue 47, never tried before): alice fills it, bob reads it, with their umasks.

The cache directory is what an admin sets up for a group (``/data/cache``: root's, the
group's, mode 2775, or 3775 with the sticky bit); alice and bob are two uids of that
group, each process started as root and dropped to the user (tests/fixtures/as_user.py),
so every access is checked against the user's permissions. What must hold whatever the
modes: bob is served exactly the store's samples or stopped by one named line (never a
traceback, never a hang), and nothing of alice's is removed except her dead downloads
where the directory lets bob remove them. The mode policy (``remote/cache_dir.py``): files
honour the creator's umask (shards lose only their write bits), directories inside the
root take the root's group bits. Needs root; skipped otherwise. Assertion tags: tests/fixtures/tally.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from pathlib import Path

import pytest
import torch

import hs_dataset
from hs_dataset.remote.cache import INDEX_NAME, META_DIR, cache_name
from hs_dataset.remote.location import open_location
from hs_dataset.remote.publish import publish_dataset
from tests.fixtures import other_user
from tests.fixtures.other_user import alice, bob, named_error, readable_by_all, shared_dir, succeeded
from tests.fixtures.samples import write_small_dataset

BOUND = 1 << 24
# every sample of the URL, as {sample_id: sha256 of its aux states}; then the final norm is fetched (a side file under meta/)
READ = """
import hashlib, json, sys, time, hs_dataset
url, cache, bound = sys.argv[1], sys.argv[2], int(sys.argv[3])
print("reading", flush=True)
start = time.monotonic()
data = hs_dataset.open_dataset(url, cache_dir=cache, max_cache_bytes=bound, prefetch_shards=0)
rows = {}
for i in range(len(data)):
    row = data[i]
    rows[row["sample_id"]] = hashlib.sha256(str(row["aux_hidden_states"].float().flatten().tolist()).encode()).hexdigest()
data.final_norm()
data.close()
print(json.dumps({"rows": rows, "elapsed_s": time.monotonic() - start}))
"""


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(str(tensor.float().flatten().tolist()).encode()).hexdigest()


@pytest.fixture
def shared_base():
    """A directory in the system temp dir that both users may enter (see tests/fixtures/other_user.py)."""
    with other_user.shared_base() as base:
        yield base


@pytest.fixture
def store(shared_base):
    """(url, {sample_id: digest}, shard cache names): 8 samples in 4 shards under file://<base>/bucket/ds, readable by all."""
    local = shared_base / "local"
    write_small_dataset(local)
    url = f"file://{shared_base}/bucket/ds"
    publish_dataset(local, open_location(url))
    readable_by_all(shared_base / "bucket")
    data = hs_dataset.open_dataset(local)
    expected = {data[i]["sample_id"]: digest(data[i]["aux_hidden_states"]) for i in range(len(data))}
    return url, expected, [cache_name(record) for record in data.manifest.shards]


def read_as(user, url: str, cache: Path, bound: int = BOUND):
    return user.run(READ, url, str(cache), str(bound))


def served(done) -> dict:
    """The rows a successful READ printed."""
    return json.loads(succeeded(done).strip().splitlines()[-1])


def snapshot(cache: Path, owner: int) -> dict[str, tuple[int, int, bytes]]:
    """Every file of ``owner`` under ``cache``: (inode, mtime_ns, bytes), to prove another user left them alone."""
    files = {}
    for base, _dirs, names in os.walk(cache):
        for name in names:
            path = Path(base, name)
            st = path.lstat()
            if st.st_uid == owner and name != INDEX_NAME:  # the index is the cache's to rewrite: its entries, not alice's data
                files[str(path.relative_to(cache))] = (st.st_ino, st.st_mtime_ns, path.read_bytes())
    return files


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.mark.parametrize(("umask_a", "umask_b"), [("022", "022"), ("002", "002"), ("002", "022"), ("022", "002")])
def test_a_cache_alice_filled_is_read_by_bob(store, shared_base, umask_a, umask_b):
    url, expected, names = store
    cache = shared_dir(shared_base, "cache")
    first = served(read_as(alice(umask_a), url, cache))
    assert first["rows"] == expected
    hers = snapshot(cache, alice().uid)
    files = 0o666 & ~int(umask_a, 8)
    assert {n: mode(cache / n) for n in names} == dict.fromkeys(names, files & ~0o222), "placed shards: read-only, the umask's read bits"
    assert mode(cache / ".lock") == files and mode(cache / INDEX_NAME) == files, "the cache's files honour the umask"
    meta = [cache / META_DIR, *(cache / META_DIR).iterdir()]
    assert all(mode(d) == 0o2775 for d in meta), f"directories in a group-writable root are the group's: {[oct(mode(d)) for d in meta]}"

    second = served(read_as(bob(umask_b), url, cache))
    assert second["rows"] == expected, "SILENT: bob was served other samples than the store's"
    assert snapshot(cache, alice().uid) == hers, "LOST: bob changed or removed alice's files"
    print(f"alice umask {umask_a}, bob umask {umask_b}: bob read {len(second['rows'])} samples in {second['elapsed_s']:.2f} s")


def test_the_umask_decides_who_may_read_what_the_cache_creates(store, shared_base):
    """A umask of 077: nothing the cache creates is readable by anyone else (the shards were 0444 whatever the umask)."""
    url, expected, names = store
    cache = shared_dir(shared_base, "home", 0o2775) / "cache"
    assert served(read_as(alice("077"), url, cache))["rows"] == expected
    assert mode(cache) == 0o2700 and {mode(cache / n) for n in names} == {0o400}
    assert mode(cache / ".lock") == mode(cache / INDEX_NAME) == 0o600
    assert all(mode(d) == 0o2700 for d in [cache / META_DIR, *(cache / META_DIR).iterdir()])

    line = named_error(read_as(bob(), url, cache))
    assert line.startswith(f"ReadOnlyError: {cache}: ") and f"uid {alice().uid}" in line and "umask 002" in line, line


def test_bob_may_not_read_the_lock_alice_made_under_umask_077(store, shared_base):
    url, expected, _names = store
    cache = shared_dir(shared_base, "cache")
    assert served(read_as(alice("077"), url, cache))["rows"] == expected
    hers = snapshot(cache, alice().uid)
    line = named_error(read_as(bob(), url, cache))
    assert line.startswith(f"ReadOnlyError: {cache / '.lock'}: ") and f"uid {alice().uid} (mode 0600)" in line, line
    assert "umask 002" in line
    assert snapshot(cache, alice().uid) == hers, "LOST: bob changed or removed alice's files"


def test_a_sticky_shared_dir_under_umask_022_is_one_named_line(store, shared_base):
    """Sticky: bob may not replace alice's index (022: nor write it): one line naming the index, her uid and the umask fix."""
    url, expected, _names = store
    cache = shared_dir(shared_base, "cache", 0o3775)
    assert served(read_as(alice(), url, cache))["rows"] == expected
    hers = snapshot(cache, alice().uid)
    index = (cache / INDEX_NAME).read_bytes()
    line = named_error(read_as(bob(), url, cache))
    assert line.startswith(f"ReadOnlyError: {cache / INDEX_NAME}: ") and f"uid {alice().uid} (mode 0644)" in line, line
    assert "umask 002" in line and "own cache_dir" in line
    assert snapshot(cache, alice().uid) == hers and (cache / INDEX_NAME).read_bytes() == index, "LOST: bob changed alice's files"


def test_a_sticky_shared_dir_under_umask_002_serves_bob_and_never_evicts_alices_shards(store, shared_base):
    """Bob may not remove alice's shards (sticky): with room he is served; with a bound only her shards' removal would meet, one line."""
    url, expected, names = store
    cache = shared_dir(shared_base, "cache", 0o3775)
    assert served(read_as(alice("002"), url, cache))["rows"] == expected
    hers = snapshot(cache, alice().uid)
    assert served(read_as(bob("002"), url, cache))["rows"] == expected, "SILENT: bob was served other samples than the store's"

    small = sum((cache / n).stat().st_size for n in names) + 4 * 4096  # alice's shards and room for little else
    line = named_error(read_as(bob("002"), _other_dataset(shared_base), cache, small))
    assert (
        line.startswith(f"UsageError: {cache}: the cache bound {small} bytes cannot hold")
        and "another user's files this user may not remove" in line
    ), line
    assert snapshot(cache, alice().uid) == hers, "LOST: bob removed alice's shards from a sticky directory"


def _other_dataset(base: Path) -> str:
    """A second dataset (other samples, so other shard hashes) under file://<base>/bucket/other, readable by all."""
    local = base / "local-other"
    write_small_dataset(local, prefix="o", base_tokens=40)
    url = f"file://{base}/bucket/other"
    publish_dataset(local, open_location(url))
    readable_by_all(base / "bucket")
    return url


# a download of alice's that died: a temp naming her (now dead) pid, as a kill -9 mid-download leaves it
DEAD_TEMP = """
import os, sys
from hs_dataset.formats.atomic import temp_path_for
from hs_dataset.remote.cache import ShardCache
cache = ShardCache(sys.argv[1], 1 << 24)
temp = cache.directory / temp_path_for(cache.directory / sys.argv[2]).name
temp.write_bytes(b"half a shard")
print(temp)
"""


@pytest.mark.parametrize("sticky", [False, True], ids=["bob-may-remove-it", "sticky-dir"])
def test_alices_dead_download_never_blocks_bob(store, shared_base, sticky):
    url, expected, names = store
    cache = shared_dir(shared_base, "cache", 0o3775 if sticky else 0o2775)
    temp = Path(succeeded(alice("002").run(DEAD_TEMP, str(cache), names[0])).strip())
    assert temp.exists()
    got = served(read_as(bob("002"), url, cache))
    assert got["rows"] == expected, "SILENT: bob was served other samples than the store's"
    assert got["elapsed_s"] < 30, "HANG: bob waited on a download whose writer is dead"
    if sticky:
        assert temp.read_bytes() == b"half a shard", "a file bob may not remove was touched"
    else:
        assert not temp.exists(), "a dead download bob may remove is left to count toward the bound"


# a live download of alice's: a temp she holds the lock of, until told to go (or, with hide, one only she may read)
LIVE_TEMP = """
import os, sys
from hs_dataset.formats.atomic import temp_path_for
from hs_dataset.formats.held_temps import create_held
from hs_dataset.remote.cache import ShardCache
cache = ShardCache(sys.argv[1], 1 << 24)
temp = cache.directory / temp_path_for(cache.directory / sys.argv[2]).name
fd = create_held(temp)
os.write(fd, b"a quarter of a shard")
print(temp, flush=True)
sys.stdin.readline()  # held until the test says
"""


def test_alices_live_download_is_waited_for_never_removed(store, shared_base):
    url, expected, names = store
    cache = shared_dir(shared_base, "cache")
    holder = alice().start(LIVE_TEMP, str(cache), names[0])
    reader = None
    try:
        temp = Path(holder.stdout.readline().strip())
        assert temp.exists(), holder.stderr.read()
        reader = bob().start(READ, url, str(cache), str(BOUND))
        assert reader.stdout.readline().strip() == "reading", reader.stderr.read()
        time.sleep(2.0)
        assert reader.poll() is None and temp.exists(), "LOST: bob removed alice's live download (or did not wait for it)"
        holder.stdin.close()  # alice's process ends: her lock goes with it
        holder.wait(timeout=60)
        out, err = reader.communicate(timeout=120)
    finally:
        for proc in (holder, reader):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert reader.returncode == 0, f"ESCAPE: {out[-800:]}{err[-2500:]}"
    got = json.loads(out.strip().splitlines()[-1])
    assert got["rows"] == expected and got["elapsed_s"] >= 1.5, got  # it waited for her
    assert not temp.exists(), "the dead download was left behind"


def test_a_live_download_bob_may_not_read_is_one_named_line_and_stays(store, shared_base):
    """Alice's cache (022), then a download of hers under umask 077: bob cannot test its lock; he neither waits nor removes it."""
    url, expected, names = store
    cache = shared_dir(shared_base, "cache")
    assert served(read_as(alice(), url, cache))["rows"] == expected
    (cache / names[0]).unlink()  # so that bob needs the shard alice is downloading again
    holder = alice("077").start(LIVE_TEMP, str(cache), names[0])
    try:
        temp = Path(holder.stdout.readline().strip())
        assert mode(temp) == 0o600, holder.stderr.read()
        start = time.monotonic()
        line = named_error(read_as(bob(), url, cache))
        assert time.monotonic() - start < 60, "HANG"
        assert line.startswith(f"ReadOnlyError: {temp}: ") and f"uid {alice().uid} (mode 0600)" in line, line
        assert temp.exists() and holder.poll() is None, "LOST: bob removed alice's live download"
    finally:
        holder.kill()
        holder.wait()


VERIFY = """
import sys
from hs_dataset.config.remote import RemoteOptions
from hs_dataset.remote.verify import verify_remote
result = verify_remote(sys.argv[1], options=RemoteOptions(cache_dir=sys.argv[2]))
print("ok" if result.ok else result.problems)
"""


def test_bob_verifies_a_url_against_the_shared_cache_whose_parent_he_may_not_write(store, shared_base):
    """verify URL downloads into a private cache: beside cache_dir where its parent may be written, else in the temp dir."""
    url, expected, _names = store
    cache = shared_dir(shared_base, "cache")
    assert served(read_as(alice(), url, cache))["rows"] == expected
    assert succeeded(bob().run(VERIFY, url, str(cache))).strip().splitlines()[-1] == "ok"
    assert sorted(p.name for p in shared_base.iterdir()) == ["bucket", "cache", "local"], "a private verify cache was left behind"


# the stream cache (streaming/cache.py) is a dataset directory: alice writes one, bob opens it, reads it and adds a shard
STREAM = """
import json, sys, torch
from hs_dataset.streaming.cache import StreamCache
from tests.fixtures.samples import make_metadata, make_sample
root, first = sys.argv[1], int(sys.argv[2])
cache = StreamCache(__import__("pathlib").Path(root), 1 << 24, make_metadata(), final_norm_weight=torch.ones(16),
                    storage="native", dtype=torch.bfloat16, card_name="unit-test")
cache.open()
cache.write([make_sample(f"s{i:02d}", 30 + i) for i in range(first, first + 3)])
cache.lock()
try:
    _manifest, index = cache.index()
    rows = {sid: cache.read(where)["aux_hidden_states"].float().sum().item() for sid, where in index.items()}
finally:
    cache.unlock()
print(json.dumps(rows))
"""


@pytest.mark.parametrize("umask_a", ["022", "002"])
def test_a_stream_cache_alice_wrote_is_resumed_by_bob(shared_base, umask_a):
    root = shared_dir(shared_base, "streams") / "cache"
    hers = json.loads(succeeded(alice(umask_a).run(STREAM, str(root), "0")).strip().splitlines()[-1])
    assert sorted(hers) == ["s00", "s01", "s02"]
    kept = snapshot(root, alice().uid)
    done = bob().run(STREAM, str(root), "3")
    if umask_a == "002":
        rows = json.loads(succeeded(done).strip().splitlines()[-1])
        assert sorted(rows) == [f"s{i:02d}" for i in range(6)], "LOST: bob's stream lost alice's cached samples"
        assert all(rows[sid] == hers[sid] for sid in hers), "SILENT: alice's cached samples read back changed"
    else:  # the cache directory is alice's, 2755: bob may not add a shard to it
        line = named_error(done)
        assert line.startswith(f"ReadOnlyError: {root}: cannot create ") and f"belongs to uid {alice().uid}, mode 2755" in line, line
        assert "umask 002" in line
    survivors = {name: v for name, v in snapshot(root, alice().uid).items() if name in kept}
    assert all(kept[name] == value for name, value in survivors.items()), "LOST: bob changed alice's files in place"

"""What the remote cache's content check costs a read: a process's first open of a shard another process cached.

A process serves a cached shard only after hashing it itself (BLAKE3 against the
recorded hash, ``remote/verified.py``), unless it downloaded the shard itself; later
opens in the process match a stat signature and cost no hash. This times the real path
(``ShardCache.fetch`` of a shard the index lists, with this process's memo of it
cleared, as in a fresh process) per shard size, with the file's pages in memory (just
written: a shard read soon after another process cached it) and dropped first
(``posix_fadvise`` DONTNEED, where the kernel allows: the disk is read), and the hash
alone in MB/s. Prints one line per case; the figures go to docs/LIMITS.md ("Cached shards").
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_shards import drop_cache

from hs_dataset.formats.hashing import file_digests
from hs_dataset.formats.manifest import ShardRecord
from hs_dataset.remote import verified
from hs_dataset.remote.cache import ShardCache
from hs_dataset.remote.location import open_location

_MIB = 1 << 20


def cached_shard(work: Path, size: int) -> tuple[ShardCache, ShardRecord]:
    """A cache holding one shard of ``size`` random bytes, placed (downloaded, hashed, listed) as ``fetch`` places it."""
    store = work / "store"
    store.mkdir()
    with open(store / "shard.safetensors", "wb") as f:
        for _ in range(size // (64 * _MIB)):
            f.write(os.urandom(64 * _MIB))
        f.write(os.urandom(size % (64 * _MIB)))
    with open(store / "shard.safetensors", "rb") as f:
        digest = file_digests(f, ("blake3",))["blake3"]
    record = ShardRecord(file="shard.safetensors", samples=1, tokens=1, bytes=size, blake3=digest)
    cache = ShardCache(work / "cache", 2 * size + 64 * _MIB)
    cache.fetch(open_location(f"file://{store}"), record)
    return cache, record


def first_open_s(cache: ShardCache, record: ShardRecord, *, cold: bool) -> float:
    """Seconds of ``fetch`` of the cached shard as a fresh process sees it (no memo), pages dropped first if ``cold``."""
    path = cache.path_for(record)
    verified.forget(path)
    if cold:
        drop_cache([path])
    start = time.perf_counter()
    cache.fetch(None, record)  # type: ignore[arg-type] -- a hit: the store is never asked
    return time.perf_counter() - start


def hash_mb_s(path: Path) -> float:
    with open(path, "rb") as f:
        start = time.perf_counter()
        file_digests(f, ("blake3",))
        return os.path.getsize(path) / _MIB / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[64, 1024])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where the cache lies (default: a temp dir on the working disk)")
    args = parser.parse_args()
    for mib in args.sizes_mib:
        work = Path(tempfile.mkdtemp(prefix="hs-bench-cache-check-", dir=args.dir or Path.cwd()))
        try:
            cache, record = cached_shard(work, mib * _MIB)
            path = cache.path_for(record)
            rate = max(hash_mb_s(path) for _ in range(args.repeat))
            warm = min(first_open_s(cache, record, cold=False) for _ in range(args.repeat))
            cold = min(first_open_s(cache, record, cold=True) for _ in range(args.repeat))
            start = time.perf_counter()
            cache.fetch(None, record)  # type: ignore[arg-type]
            memo = time.perf_counter() - start
            print(
                f"shard={mib}MiB blake3_hash={rate:.0f}MiB/s first_open_pages_in_memory={warm * 1000:.0f}ms "
                f"first_open_from_disk={cold * 1000:.0f}ms later_open={memo * 1000:.2f}ms"
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Shards downloaded ahead of the reader, on background threads, so reading rarely waits on the network.

Ahead means the next shards in manifest order: what a sequential reader (the training
view, ``hs-dataset verify``, an export) reads next. A shuffled reader gets no benefit
and pays only the downloads it needs. The thread pool is made in the process that
uses it (DataLoader workers fork).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from hs_dataset.formats.manifest import ShardRecord
from hs_dataset.remote.cache import ShardCache
from hs_dataset.remote.location import RemoteLocation

__all__ = ["Prefetcher"]


class Prefetcher:
    """``get(i)`` returns shard ``i``'s cached path; ``ahead(i)`` starts fetching shards ``i+1 .. i+depth``."""

    def __init__(self, cache: ShardCache, loc: RemoteLocation, records: Sequence[ShardRecord], depth: int) -> None:
        self.cache, self.loc, self.records, self.depth = cache, loc, list(records), depth
        self._lock = threading.Lock()
        self._futures: dict[int, Future[Path]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._pid = -1

    def get(self, index: int) -> Path:
        """Waits for a prefetch of ``index`` under way; fetches again if its copy was evicted since (and marks it used)."""
        with self._lock:
            future = self._futures.pop(index, None) if self._pid == os.getpid() else None
        if future is not None:
            future.result()  # its errors (a hash mismatch) are the reader's
        return self.cache.fetch(self.loc, self.records[index])

    def ahead(self, index: int) -> None:
        """Call once shard ``index`` is pinned: the prefetches' room is never made by evicting it."""
        if self.depth <= 0:
            return
        with self._lock:
            pool = self._pool_here()
            for done in [i for i, f in self._futures.items() if f.done() and not index < i <= index + self.depth]:
                del self._futures[done]  # fetched for a reader that went elsewhere; the copy stays cached
            for ahead in range(index + 1, min(index + 1 + self.depth, len(self.records))):
                if ahead not in self._futures:
                    self._futures[ahead] = pool.submit(self.cache.fetch, self.loc, self.records[ahead])

    def _pool_here(self) -> ThreadPoolExecutor:
        if self._pool is None or self._pid != os.getpid():
            self._pool = ThreadPoolExecutor(max_workers=self.depth, thread_name_prefix="hs-prefetch")
            self._futures = {}
            self._pid = os.getpid()
        return self._pool

    def close(self) -> None:
        with self._lock:
            futures, self._futures = list(self._futures.values()), {}
            pool, self._pool = (self._pool, None) if self._pid == os.getpid() else (None, None)
        for future in futures:
            future.cancel()
        if pool is not None:
            pool.shutdown(wait=True)

"""The background threads that write shards while capture goes on, and the one that lists them.

At most ``writer_threads`` shards are in flight, which bounds memory (back-pressure:
:meth:`ShardFlusher.submit` blocks). A writer thread is free for the next shard once
the shard's own bytes are on disk: the directory fsync and the manifest write (three
more fsyncs, each able to wait on a journal commit that flushes every shard in flight)
are the publisher's, which lists every shard finished meanwhile in one manifest write,
so a crash loses at most the shards still being written. An error on any of these
threads is kept for the caller's next call (:meth:`ShardFlusher.raise_error`).
"""

from __future__ import annotations

import errno
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from hs_dataset.errors import DiskFullError
from hs_dataset.faults import crash_point
from hs_dataset.formats.atomic import fsync_dir
from hs_dataset.formats.manifest import ShardRecord
from hs_dataset.formats.shard_file import EncodedSample, write_shard
from hs_dataset.formats.shard_layout import shard_file_name
from hs_dataset.formats.writer_session import WriterSession

__all__ = ["ShardFlusher"]


def _nbytes(batch: list[EncodedSample]) -> int:
    return sum(s.nbytes for s in batch)


class ShardFlusher:
    """Writes batches as shards ``{shard_prefix}shard-{seq}`` of the session's dataset, then lists them."""

    def __init__(self, session: WriterSession, encoding: str, shard_prefix: str, writer_threads: int) -> None:
        self.root: Path = session.root
        self._session = session
        self._encoding = encoding
        self._shard_prefix = shard_prefix
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._in_flight = threading.BoundedSemaphore(writer_threads)
        self._futures: list[Future] = []
        self._writers = ThreadPoolExecutor(max_workers=writer_threads, thread_name_prefix="hs-shard-writer")
        # Shards written and renamed, waiting to be made durable and listed: one thread lists them, in batches.
        self._unlisted: list[tuple[ShardRecord, list[str], int]] = []
        self._unpublished_bytes = 0  # of the shards handed over and not yet listed (or failed)
        self._publisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hs-shard-publisher")
        self._publishes: list[Future] = []

    def submit(self, seq: int, batch: list[EncodedSample]) -> None:
        """Hand one shard's samples to a writer thread (blocks while ``writer_threads`` shards are in flight)."""
        self._in_flight.acquire()
        with self._lock:
            self._unpublished_bytes += _nbytes(batch)
        future = self._writers.submit(self._write_and_publish, seq, batch)
        future.add_done_callback(lambda _f: self._in_flight.release())
        self._futures = [f for f in self._futures if not f.done()] + [future]

    def _write_and_publish(self, seq: int, batch: list[EncodedSample]) -> None:
        """Write one shard and rename it into place, then hand it to the publisher."""
        ids = [s.sample_id for s in batch]
        try:
            name = shard_file_name(self._shard_prefix, seq)
            record = write_shard(self.root / name, name, batch, self._session.manifest.dataset_id, self._encoding, seq)
        except BaseException as exc:  # surfaced to the caller at the next add/flush/close
            self._fail(exc, ids, _nbytes(batch))
            return
        with self._lock:  # the samples' memory goes back as this returns, not after the listing
            self._unlisted.append((record, ids, _nbytes(batch)))
            self._publishes = [f for f in self._publishes if not f.done()] + [self._publisher.submit(self._list_unlisted)]

    def _list_unlisted(self) -> None:
        """Make the renames of the shards written so far durable, then list them all in one manifest write.

        A shard is listed only after a directory fsync that follows its rename, so a
        manifest on disk never names a shard whose rename could still be lost.
        """
        with self._lock:
            ready, self._unlisted = self._unlisted, []
        if not ready:  # listed by an earlier call
            return
        try:
            fsync_dir(self.root)
            crash_point("shard.after_publish")
            self._session.list_shards([record for record, _ids, _nbytes in ready])
        except BaseException as exc:
            self._fail(exc, [sid for _record, batch_ids, _nbytes in ready for sid in batch_ids], sum(n for *_, n in ready))
            return
        self._session.mark_stored([(record, ids) for record, ids, _nbytes in ready])
        with self._lock:
            self._unpublished_bytes -= sum(n for *_, n in ready)

    @property
    def unpublished_bytes(self) -> int:
        """Encoded bytes of the shards handed over but not yet listed: what a progress line counts as the open shard."""
        with self._lock:
            return self._unpublished_bytes

    def _fail(self, exc: BaseException, ids: list[str], nbytes: int) -> None:
        """Record a background error for the caller's next call; the samples are no longer pending."""
        with self._lock:
            if self._error is None:
                self._error = exc
            self._unpublished_bytes -= nbytes
        self._session.forget(ids)

    def raise_error(self) -> None:
        """Raise the first error of a background thread, once (a full disk as :class:`DiskFullError`)."""
        with self._lock:
            error, self._error = self._error, None
        if error is None:
            return
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            raise DiskFullError(
                errno.ENOSPC,
                f"disk full while writing a shard in {self.root}: the partial shard was discarded and the manifest "
                "still lists only complete shards; free space and run the same command again to resume",
            ) from error
        raise error

    def wait_written(self) -> None:
        """Wait until every shard handed over is written and renamed (its listing may still be running)."""
        for future in list(self._futures):
            future.result()

    def wait(self) -> None:
        """Wait until every shard handed over is written and listed."""
        self.wait_written()
        with self._lock:
            publishes = list(self._publishes)
        for future in publishes:
            future.result()

    def shutdown(self) -> None:
        """Stop the threads, the writers first: then none can queue a listing any more."""
        self._writers.shutdown(wait=True)
        self._publisher.shutdown(wait=True)

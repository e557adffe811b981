"""Bytes to and from object storage with the hash checked on the bytes that moved.

An upload streams the local file to the object and hashes exactly the chunks it
sends; the object then must hold the recorded size and the sent bytes the recorded
hash (BLAKE3, or sha256 for format-1 shards and small files), else it is deleted and
the upload fails. A download streams into a temp file beside its destination (the bounded
reads of :mod:`.reads`: never more than the recorded size plus one byte, within the
operation's deadline), hashed on the way, and is renamed into place only when size and
hash match, so a damaged, longer or replaced object never reaches a reader.

Objects are written where they will stay: an object store publishes an object whole
when its upload completes (one PUT, or a completed multipart upload), so a process
killed mid-upload leaves nothing under the name. A plain directory (``file://``) has no
such guarantee, so there the bytes go to a temp name that is renamed over the final one.
"""

from __future__ import annotations

import os
import queue
import secrets
import threading
from collections.abc import Iterable
from pathlib import Path

from hs_dataset.errors import IntegrityError
from hs_dataset.faults import crash_point
from hs_dataset.formats.atomic import TEMP_PREFIX, publish, remove_quietly, temp_path_for
from hs_dataset.formats.hashing import new_hasher
from hs_dataset.formats.paths import open_regular
from hs_dataset.remote.location import RemoteLocation, storage_errors
from hs_dataset.remote.reads import CHUNK_BYTES, object_chunks

__all__ = ["Expected", "download_file", "put_bytes", "receive_file", "temp_key", "upload_file"]

_BUFFERS = 3  # receive buffers per download: one filling, one being hashed and written, one spare


class Expected:
    """What the moved bytes must be: a size and, where one is recorded, a hash (algorithm, hex digest)."""

    def __init__(self, size: int, algorithm: str | None = None, digest: str | None = None) -> None:
        self.size, self.algorithm, self.digest = size, algorithm, digest

    def check(self, size: int, digest: str | None, where: str, fix: str) -> None:
        if size != self.size:
            raise IntegrityError(f"{where}: {size} bytes moved, expected {self.size} ({fix})")
        if self.digest is not None and digest != self.digest:
            raise IntegrityError(f"{where}: {self.algorithm} {digest} != recorded {self.digest} ({fix})")


def _write_object(loc: RemoteLocation, name: str, chunks: Iterable[bytes], expected: Expected) -> None:
    """Write ``chunks`` to ``name``; delete what was written when it is not ``expected``."""
    key = loc.key(name)
    local = loc.is_local
    target = temp_key(key) if local else key
    hasher = new_hasher(expected.algorithm) if expected.algorithm else None
    sent = 0
    with storage_errors(f"{loc.url}/{name}"):
        if local:
            loc.fs.makedirs(key.rpartition("/")[0], exist_ok=True)
        try:
            with loc.fs.open(target, "wb") as out:
                for chunk in chunks:
                    if hasher is not None:
                        hasher.update(chunk)
                    out.write(chunk)
                    sent += len(chunk)
            expected.check(
                sent,
                hasher.hexdigest() if hasher else None,
                f"{loc.url}/{name}",
                "the local file changed while it was uploaded; upload again",
            )
            stored = int(loc.call("info", target)["size"])
            expected.check(stored, expected.digest, f"{loc.url}/{name}", "the store kept other bytes than were sent; upload again")
        except BaseException:
            _remove(loc, target)
            raise
        if local:
            loc.fs.mv(target, key)


def temp_key(key: str) -> str:
    """A temp name beside ``key`` in a ``file://`` store, renamed over it once whole (a plain directory publishes nothing atomically)."""
    head, _, tail = key.rpartition("/")
    return f"{head}/{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}-{tail}"


def _remove(loc: RemoteLocation, key: str) -> None:
    try:
        loc.call("rm", key)
    except Exception:  # noqa: BLE001 -- best effort: the object is not listed by any manifest
        pass


def _file_chunks(path: Path, size: int) -> Iterable[bytes]:
    """The file's bytes in chunks; the crash point ``remote.mid_upload`` fires once half are sent."""
    half, sent, crashed = size // 2, 0, False
    with open_regular(path, what="file to upload") as f:
        while chunk := f.read(CHUNK_BYTES):
            yield chunk
            sent += len(chunk)
            if not crashed and sent >= half:
                crashed = True
                crash_point("remote.mid_upload")


def upload_file(path: Path, loc: RemoteLocation, name: str, expected: Expected) -> None:
    """Upload the local file ``path`` to ``loc/name``, checked against ``expected`` on the bytes sent and stored."""
    _write_object(loc, name, _file_chunks(path, expected.size), expected)


def put_bytes(loc: RemoteLocation, name: str, data: bytes) -> None:
    """A small object (a manifest) written whole: a reader sees the old one or the new one, never a part."""
    _write_object(loc, name, [data], Expected(len(data)))


class _HashingSink(threading.Thread):
    """Hashes and writes the received chunks on its own thread, in order.

    Why: all three steps release the GIL, so the next chunk can be received while this
    one is hashed and written, faster than receiving, hashing and writing on one thread
    even where the store's server shares the cores (docs/REMOTE.md;
    ``benchmarks/bench_remote_read.py`` times the three). A failure stops
    the work but not the draining, so the receiving side never waits on a dead sink.
    """

    def __init__(self, out, hasher, buffers: queue.Queue[bytearray]) -> None:
        super().__init__(name="hs-download-sink", daemon=True)
        self.out, self.hasher, self.buffers = out, hasher, buffers
        self.work: queue.Queue[tuple[memoryview | bytes, bytearray | None] | None] = queue.Queue(maxsize=_BUFFERS)
        self.got = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        while (item := self.work.get()) is not None:
            chunk, buf = item
            if self.error is None:
                try:
                    if self.hasher is not None:
                        self.hasher.update(chunk)
                    self.out.write(chunk)
                    self.got += len(chunk)
                except BaseException as exc:  # noqa: BLE001 -- re-raised on the receiving thread
                    self.error = exc
            if buf is not None:
                self.buffers.put(buf)


def _receive_into(out, hasher, loc: RemoteLocation, name: str, size: int) -> tuple[int, BaseException | None]:
    """Stream ``loc/name`` into the open file ``out`` (hashing it too): the bytes written (at most ``size + 1``), and what failed locally.

    A local failure (the disk full or read-only) is returned, not raised, so the caller
    raises it outside :func:`storage_errors`: it is no failure of the store.
    """
    buffers: queue.Queue[bytearray] = queue.Queue()
    for _ in range(_BUFFERS):
        buffers.put(bytearray(CHUNK_BYTES))
    sink = _HashingSink(out, hasher, buffers)
    sink.start()
    chunks = object_chunks(loc.fs, loc.key(name), size, budget=loc.budget, where=f"{loc.url}/{name}", buffers=buffers)
    try:
        for item in chunks:
            sink.work.put(item)
            if sink.error is not None:
                break
    finally:
        sink.work.put(None)
        sink.join()
    return sink.got, sink.error


def receive_file(loc: RemoteLocation, name: str, temp: Path, expected: Expected, *, durable: bool = True) -> None:
    """Download ``loc/name`` into ``temp`` (created, or already allocated by the caller), refusing bytes that are not ``expected``.

    ``temp`` is removed on any failure. The caller places it (a rename): the cache does
    that under its lock, so its index and the name change together.
    """
    hasher = new_hasher(expected.algorithm) if expected.algorithm else None
    where = f"{loc.url}/{name}"
    try:
        with open(temp, "r+b" if temp.exists() else "wb") as out:  # local: its errors are the disk's, not the store's
            with storage_errors(where):
                got, failed = _receive_into(out, hasher, loc, name, expected.size)
            if failed is not None:
                raise failed
            out.truncate(got)
            out.flush()
            if durable:
                os.fsync(out.fileno())
        expected.check(
            got,
            hasher.hexdigest() if hasher else None,
            where,
            "the object is damaged or was replaced: upload it again from the rank's staging directory, or rebuild that part",
        )
    except BaseException:
        remove_quietly(temp)
        raise


def download_file(loc: RemoteLocation, name: str, dest: Path, expected: Expected) -> None:
    """Download ``loc/name`` to ``dest`` atomically and durably: its bytes are checked before they get the name."""
    temp = temp_path_for(dest)
    receive_file(loc, name, temp, expected)
    publish(temp, dest)

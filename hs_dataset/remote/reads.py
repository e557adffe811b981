"""Every byte read from a store, bounded in size and in time whatever the store answers.

A store is untrusted input: it may ignore the ``Range`` a read asks for, send more bytes
than an object's record, never end a body, trickle a byte a second, or accept a
connection and never answer. So a read asks for exact bytes and takes no more. Over
HTTP (the presigned URL s3fs and gcsfs sign, or an ``http(s)://`` store itself) it is
one GET whose status and ``Content-Range`` are checked and whose body is read up to the
bytes asked for, under a total :class:`Deadline` that a watchdog enforces by shutting
the socket down (a per-read socket timeout never fires on a trickle). The deadline is
the :class:`Budget`'s: ``timeout_s`` for the answer, plus the bytes expected (a shard's
recorded size, else what the answer's Content-Length says, up to what was asked) at
``min_bytes_per_s``. Elsewhere (``file://``, ``memory://``) the filesystem's own reads
of exactly those bytes.
"""

from __future__ import annotations

import os
import queue
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from hs_dataset.config.remote import DEFAULT_MIN_BYTES_PER_S, DEFAULT_REQUEST_TIMEOUT_S
from hs_dataset.errors import IntegrityError, RemoteError

__all__ = ["CHUNK_BYTES", "Budget", "Deadline", "http_url", "object_chunks", "read_range"]

CHUNK_BYTES = 8 * 1024 * 1024
_READ_BYTES = 1 << 20  # one read of a small body (a manifest, a header): a list of these never outgrows what was asked
_SIGNED_URL_S = 3600  # a presigned download URL's life: one shard's download
_CONTENT_RANGE_RE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


class Deadline:
    """When an operation must be over: ``seconds`` from its start (see RemoteOptions.request_timeout_s)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def check(self, where: str) -> float:
        """The seconds left; RemoteError once none are."""
        left = self.left()
        if left <= 0:
            raise self.expired(where)
        return left

    def extend(self, seconds: float) -> None:
        self.end += seconds
        self.seconds += seconds

    def expired(self, where: str) -> RemoteError:
        return RemoteError(
            f"{where}: the store did not finish answering within {self.seconds:.1f} s (stalled, or trickling bytes); "
            "if it is only slow, raise request_timeout_s or lower min_bytes_per_s in the remote options"
        )


@dataclass(frozen=True)
class Budget:
    """The time a request is given (RemoteOptions): ``timeout_s`` to answer, plus its bytes at ``min_bytes_per_s``."""

    timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    min_bytes_per_s: int = DEFAULT_MIN_BYTES_PER_S

    def deadline(self, size: int = 0) -> Deadline:
        return Deadline(self.timeout_s + size / self.min_bytes_per_s)


def http_url(fs: Any, key: str) -> str | None:
    """An http(s) URL that serves ``key``: the key itself on an http(s) store, a presigned one where fsspec signs, else None.

    Why presigned: one plain HTTP GET streams several times faster than the async
    client's reads (docs/REMOTE.md), and it is a body whose size and time this module controls.
    """
    if key.startswith(("http://", "https://")):
        return key
    try:
        url = fs.sign(key, expiration=_SIGNED_URL_S)
    except Exception:  # noqa: BLE001 -- NotImplementedError, or a backend that cannot sign here: read through fsspec
        return None
    return url if isinstance(url, str) and url.startswith(("http://", "https://")) else None


class _Watchdog:
    """Shuts the response's socket down at the deadline, so a blocked read returns however slowly the bytes come."""

    def __init__(self, response: Any, seconds: float) -> None:
        self.fired = False
        self._sock: socket.socket | None = None
        try:
            self._sock = socket.socket(fileno=os.dup(response.fileno()))
        except (OSError, ValueError, AttributeError):
            self._sock = None
        self._timer = threading.Timer(max(seconds, 0.0), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.fired = True
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cancel(self) -> None:
        self._timer.cancel()
        if self._sock is not None:
            self._sock.close()


@contextmanager
def _get(url: str, first: int, last: int | None, budget: Budget, expect: int | None, where: str) -> Iterator[tuple[Any, Deadline]]:
    """One GET of bytes ``[first, last)`` (the whole object when ``first == 0`` and ``last`` is None), its status checked.

    Yields the response and its deadline: ``budget`` for ``expect`` bytes, or where that
    is None for what the Content-Length says (none when it says nothing), at most ``last - first``.
    """
    headers = {} if first == 0 and last is None else {"Range": f"bytes={first}-{'' if last is None else last - 1}"}
    deadline = budget.deadline()
    left = deadline.check(where)
    try:
        response = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=left)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 404:
            raise FileNotFoundError(where) from None
        if exc.code == 416:  # the object ends before ``first``: nothing there
            raise EOFError(where) from None
        raise RemoteError(f"{where}: the store answered HTTP {exc.code} {exc.reason}; check the URL, bucket and credentials") from None
    except TimeoutError:
        raise deadline.expired(where) from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, (TimeoutError, socket.timeout)):
            raise deadline.expired(where) from None
        raise RemoteError(f"{where}: cannot reach the store ({exc.reason}); check the endpoint") from None
    if expect is None:
        length = str(response.headers.get("Content-Length") or "0")
        expect = int(length) if length.isdigit() else 0
        expect = expect if last is None else min(expect, last - first)
    deadline.extend(expect / budget.min_bytes_per_s)
    watchdog = _Watchdog(response, deadline.left())
    try:
        _check_status(response, first, last, where)
        yield response, deadline
    except BaseException:
        if watchdog.fired:
            raise deadline.expired(where) from None
        raise
    finally:
        watchdog.cancel()
        response.close()
    if watchdog.fired:
        raise deadline.expired(where)


def _check_status(response: Any, first: int, last: int | None, where: str) -> None:
    """206 with the bytes asked for, or 200 where the read starts at byte 0 (its first bytes are the ones asked for)."""
    if response.status == 200 and first == 0:
        return
    if response.status == 200:
        raise RemoteError(
            f"{where}: the store ignored the Range of a read from byte {first} (HTTP 200, the whole object); "
            "hs_dataset reads parts of shards: use a store that serves ranged reads"
        )
    if response.status != 206:
        raise RemoteError(f"{where}: the store answered HTTP {response.status} to a read; expected 200 or 206")
    text = str(response.headers.get("Content-Range", ""))
    match = _CONTENT_RANGE_RE.match(text)
    if match is None or int(match.group(1)) != first or (last is not None and int(match.group(2)) > last - 1):
        asked = f"{first}-{'' if last is None else last - 1}"
        raise RemoteError(f"{where}: the store answered bytes {text[:80]!r} to a read of bytes {asked}; it serves other bytes than asked")


def read_range(fs: Any, key: str, first: int, last: int, *, budget: Budget, where: str, expect: int | None = None) -> bytes | bytearray:
    """Bytes ``[first, last)`` of ``key`` (fewer where the object ends first), never more, within ``budget``.

    ``expect``: the bytes the deadline allows for (None: what the answer says it sends).
    FileNotFoundError where the object is missing.
    """
    if last <= first:
        return b""
    url = http_url(fs, key)
    if url is None:
        with fs.open(key, "rb", block_size=min(CHUNK_BYTES, last - first), cache_type="none") as src:
            src.seek(first)
            return _read_up_to(src.read, last - first, budget.deadline(last - first), where)
    try:
        with _get(url, first, last, budget, expect, where) as (response, deadline):
            return _read_up_to(response.read, last - first, deadline, where)
    except EOFError:
        return b""


def _read_up_to(read: Any, limit: int, deadline: Deadline, where: str) -> bytearray:
    """At most ``limit`` bytes from ``read``, in reads of a MiB (what arrives beyond is never read)."""
    data = bytearray()
    while len(data) < limit:
        chunk = read(min(_READ_BYTES, limit - len(data)))
        if not chunk:
            break
        data += chunk
        deadline.check(where)
    return data


def object_chunks(
    fs: Any,
    key: str,
    size: int,
    *,
    budget: Budget,
    where: str,
    buffers: queue.Queue[bytearray],
) -> Iterator[tuple[memoryview | bytes, bytearray | None]]:
    """The object's bytes in order, at most ``size + 1`` (one more tells an object longer than its record), within ``budget``.

    Each chunk comes with the buffer it lies in (handed back to ``buffers`` once used), or None.
    """
    cap = size + 1
    url = http_url(fs, key)
    if url is None:
        deadline = budget.deadline(size)
        with fs.open(key, "rb", block_size=CHUNK_BYTES, cache_type="none") as src:
            got = 0
            while got < cap and (chunk := src.read(min(CHUNK_BYTES, cap - got))):
                got += len(chunk)
                yield chunk, None
                deadline.check(where)
        return
    with _get(url, 0, None, budget, size, where) as (response, _deadline):
        length = response.headers.get("Content-Length")
        if length is not None and str(length).isdigit() and int(length) != size:
            raise IntegrityError(
                f"{where}: the store holds {length} bytes, the manifest records {size} (the object is damaged or was replaced: "
                "upload it again from the rank's staging directory, or rebuild that part)"
            )
        got = 0
        while got < cap:
            buf = buffers.get()
            n = response.readinto(memoryview(buf)[: min(len(buf), cap - got)])
            if not n:
                buffers.put(buf)
                return
            got += n
            yield memoryview(buf)[:n], buf

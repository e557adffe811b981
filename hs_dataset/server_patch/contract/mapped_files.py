"""Mappings of staging files kept from one dump to the next, so a recycled file copies at memory speed.

Stdlib only (runs inside SGLang scheduler processes and in the client).

Why: on tmpfs, ``read`` and ``write`` pay a page-cache lookup per 4 KiB page, and a
fresh ``mmap`` pays a page fault per page just the same, so either is several times
slower than a copy through a mapping whose pages are already in the page table
(docs/SGLANG.md, "Kept mappings"; ``benchmarks/bench_staging_pool.py``). Dump files are recycled through
the spare pool (``spares.hand_back_dump``), so the same few files come back dump
after dump: the server writes a claimed spare through the mapping it kept from the
file's last round, and the client reads each dump through its own.

Safety:

* an entry holds its own descriptor of the file, so the inode cannot be freed, and its
  number cannot go to another file, while it is cached: a hit by (device, inode) is
  the same file;
* a mapping is used only within the file's size as ``fstat`` gives it on the caller's
  descriptor, and is never unmapped while a caller is inside :meth:`FileMaps.mapped`;
* entries of files no longer linked anywhere (swept spares, deleted dumps) are unmapped
  at the next prune (at most every :data:`PRUNE_INTERVAL_S`, and at :meth:`close`), so
  their memory goes back; idle entries beyond ``max_bytes`` go least recently used first;
* where ``mmap`` is missing or fails, :meth:`mapped` yields None and the caller falls
  back to ``read``/``write``.

A file truncated by someone else while mapped (nothing in the protocol does: a dump is
written before it is published and read before it is handed back) would raise SIGBUS
in the process reading it; the staging directory is private to one user for that
reason among others.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from hs_dataset.libc import libc_function

__all__ = ["PRUNE_INTERVAL_S", "FileMaps", "copy_into", "copy_out"]

PRUNE_INTERVAL_S = 0.05  # how stale an unlinked file's mapping may get before it is noticed

_MAP_FAILED = ctypes.c_void_p(-1).value


_mmap = libc_function("mmap", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64)
_munmap = libc_function("munmap", ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
_MAPPING = _mmap is not None and _munmap is not None and hasattr(mmap, "MAP_SHARED")  # else: the callers' plain read/write


@dataclass
class _Entry:
    fd: int
    address: int
    length: int
    users: int = 0
    last_used: float = 0.0


class FileMaps:
    """A bounded cache of shared mappings, one per file, reused across dumps of the same file."""

    def __init__(self, *, writable: bool, max_bytes: int = 4 << 30) -> None:
        self.writable = writable
        self.max_bytes = int(max_bytes)
        self._prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0) if _MAPPING else 0
        self._entries: dict[tuple[int, int], _Entry] = {}
        self._mapped = 0
        self._lock = threading.Lock()
        self._last_prune = 0.0
        self._closed = False

    @property
    def mapped_bytes(self) -> int:
        return self._mapped

    def __len__(self) -> int:
        return len(self._entries)

    @contextmanager
    def mapped(self, fd: int, size: int, *, kept_only: bool = False, file_stat: os.stat_result | None = None) -> Iterator[int | None]:
        """The address of a shared mapping of ``fd``'s file covering ``[0, size)``, or None.

        The caller must keep within ``size`` and must have made sure the file is at
        least that long (``fstat``, or its own ``ftruncate``). ``fd`` must be open for
        reading (and writing, for a writable cache).

        ``kept_only``: yield an address only where one was kept from an earlier round;
        a file seen for the first time is mapped for next time but yields None. Why: a
        first copy through a new mapping pays a fault per page, which costs more than
        ``read`` on tmpfs (docs/SGLANG.md, "Kept mappings"), and a file that is
        deleted after this round (the spare pool was full) never pays it at all.

        ``file_stat``: the caller's own ``fstat`` of ``fd``, where it has one (only the
        device and inode are read, which no truncation changes), so a dump costs one
        ``fstat``, not two.
        """
        entry = self._acquire(fd, size, kept_only, file_stat) if size > 0 and _MAPPING and not self._closed else None
        try:
            yield entry.address if entry is not None else None
        finally:
            if entry is not None:
                self._release(entry)

    def _acquire(self, fd: int, size: int, kept_only: bool, file_stat: os.stat_result | None) -> _Entry | None:
        st = file_stat or os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.length < size:
                if entry.users:  # the same file in use by another caller: not ours to remap
                    return None
                self._drop_locked(key)
                entry = None
            if entry is None:
                entry = self._map_locked(key, fd, size)
                if entry is None or kept_only:
                    return None
            entry.users += 1
            return entry

    def _map_locked(self, key: tuple[int, int], fd: int, size: int) -> _Entry | None:
        own = os.dup(fd)
        address = _mmap(None, size, self._prot, mmap.MAP_SHARED, own, 0)
        if address is None or address == _MAP_FAILED:
            os.close(own)
            return None
        entry = self._entries[key] = _Entry(own, address, size)
        self._mapped += size
        return entry

    def _release(self, entry: _Entry) -> None:
        with self._lock:
            entry.users -= 1
            entry.last_used = time.monotonic()
            self._trim_locked(entry.last_used)

    def _drop_locked(self, key: tuple[int, int]) -> None:
        entry = self._entries.pop(key)
        _munmap(entry.address, entry.length)
        os.close(entry.fd)
        self._mapped -= entry.length

    def _trim_locked(self, now: float, *, force_prune: bool = False) -> None:
        """Unmap idle entries of unlinked files (every PRUNE_INTERVAL_S), then the oldest idle ones over the cap."""
        if force_prune or now - self._last_prune >= PRUNE_INTERVAL_S:
            self._last_prune = now
            for key, entry in list(self._entries.items()):
                if not entry.users and _unlinked(entry.fd):
                    self._drop_locked(key)
        if self._mapped > self.max_bytes:
            idle = sorted((e.last_used, k) for k, e in self._entries.items() if not e.users)
            for _, key in idle:
                if self._mapped <= self.max_bytes:
                    break
                self._drop_locked(key)

    def prune(self) -> None:
        """Unmap the idle entries of files no longer linked (the sweeper calls this when capture is idle)."""
        with self._lock:
            self._trim_locked(time.monotonic(), force_prune=True)

    def close(self) -> None:
        """Unmap every idle entry; entries in use are unmapped as their callers finish."""
        with self._lock:
            self._closed = True
            self.max_bytes = 0
            self._trim_locked(time.monotonic(), force_prune=True)


def _unlinked(fd: int) -> bool:
    try:
        return os.fstat(fd).st_nlink == 0
    except OSError:
        return True


def copy_into(address: int, offset: int, buffer: memoryview) -> None:
    """Copy ``buffer`` to ``address + offset`` (``ctypes.memmove``: one thread, the GIL released)."""
    if not buffer.nbytes:
        return
    if buffer.readonly:  # bytes (a dump's header): small, so one copy into ctypes memory is nothing
        source = ctypes.c_char_p(buffer.tobytes())
        ctypes.memmove(address + offset, source, buffer.nbytes)
        return
    source = (ctypes.c_char * buffer.nbytes).from_buffer(buffer)
    ctypes.memmove(address + offset, source, buffer.nbytes)


def copy_out(address: int, offset: int, destination: memoryview) -> None:
    """Copy ``destination.nbytes`` bytes from ``address + offset`` into the writable ``destination``."""
    if not destination.nbytes:
        return
    target = (ctypes.c_char * destination.nbytes).from_buffer(destination)
    ctypes.memmove(target, address + offset, destination.nbytes)

"""Host buffers reused once the last tensor over them is gone (a leaf: torch only).

Memory the process has not touched before costs a page fault per 4 KiB on first use,
more than the copy into it. The SGLang client reads every dump into a leased buffer, and
the shard writer holds each sample, buffer and all, until its shard is on disk; then the
buffer goes back to the client's pool for a later dump. A holder like the writer asks the
pool to keep room for what it will hand back (:meth:`HostBufferPool.hold_room`), since
it returns a whole shard's buffers at once (benchmarks/bench_staging_pool.py measures the
client's read both ways; bench_transport.py and bench_node.py the whole path).

A lease is a uint8 tensor over a pooled buffer; the tensor holds a small ctypes view of
the buffer, and when torch drops that view (every tensor and slice over it is gone) a
finalizer returns the buffer to the pool. Idle buffers beyond ``max_idle_bytes`` are
freed.
"""

from __future__ import annotations

import bisect
import ctypes
import threading
import weakref
from collections.abc import Callable

import torch

__all__ = ["HostBufferPool", "lease_pool"]

_GRANULARITY = 1 << 20  # buffers are whole MiBs, so nearby sizes share them

_leases_lock = threading.Lock()
_lease_starts: list[int] = []  # sorted start addresses of every live lease, of every pool
_lease_ends: dict[int, tuple[int, HostBufferPool]] = {}  # start -> (end, the pool it goes back to)


def lease_pool(t: torch.Tensor) -> HostBufferPool | None:
    """The pool whose live lease holds ``t``'s memory, or None for memory of no pool."""
    address = t.data_ptr()
    with _leases_lock:
        i = bisect.bisect_right(_lease_starts, address) - 1
        if i < 0:
            return None
        end, pool = _lease_ends[_lease_starts[i]]
        return pool if address < end else None


def _register(start: int, nbytes: int, pool: HostBufferPool) -> None:
    with _leases_lock:
        bisect.insort(_lease_starts, start)
        _lease_ends[start] = (start + nbytes, pool)


def _unregister(start: int) -> None:
    with _leases_lock:
        del _lease_starts[bisect.bisect_left(_lease_starts, start)]
        del _lease_ends[start]


class HostBufferPool:
    """Lease uint8 host tensors of any size; their memory comes back when the tensors die."""

    def __init__(self, max_idle_bytes: int = 1 << 30, min_bytes: int = 1 << 20) -> None:
        self.max_idle_bytes = int(max_idle_bytes)
        self.min_bytes = int(min_bytes)  # smaller reads are cheaper from the allocator than from here
        self._idle: list[torch.Tensor] = []
        self._idle_bytes = 0
        self._lock = threading.Lock()
        self.stats = {"leased": 0, "reused": 0, "allocated": 0}

    def lease(self, nbytes: int) -> torch.Tensor:
        """A writable uint8 tensor of exactly ``nbytes`` (contents undefined)."""
        if nbytes < self.min_bytes:
            return torch.empty(nbytes, dtype=torch.uint8)
        buffer = self._take(nbytes)
        view = (ctypes.c_ubyte * nbytes).from_address(buffer.data_ptr())
        _register(buffer.data_ptr(), nbytes, self)
        weakref.finalize(view, self._give_back, buffer)  # holds the buffer while any tensor over the view lives
        return torch.frombuffer(view, dtype=torch.uint8)

    def _take(self, nbytes: int) -> torch.Tensor:
        with self._lock:
            self.stats["leased"] += 1
            fits = [i for i, b in enumerate(self._idle) if b.numel() >= nbytes]
            if fits:
                best = self._idle.pop(min(fits, key=lambda i: self._idle[i].numel()))  # by position: == on tensors compares values
                self._idle_bytes -= best.numel()
                self.stats["reused"] += 1
                return best
            self.stats["allocated"] += 1
        size = -(-nbytes // _GRANULARITY) * _GRANULARITY
        return torch.empty(size, dtype=torch.uint8)

    def _give_back(self, buffer: torch.Tensor) -> None:
        _unregister(buffer.data_ptr())
        with self._lock:
            if self._idle_bytes + buffer.numel() <= self.max_idle_bytes:
                self._idle.append(buffer)
                self._idle_bytes += buffer.numel()

    def hold_room(self, nbytes: int) -> Callable[[], None]:
        """Keep up to ``nbytes`` more idle until the returned function is called.

        Why: a holder of many leases (the shard writer keeps a shard's samples until it is
        on disk) gives them back in bursts; above the base cap they would be freed, and
        the next reads would fault in new memory again. Releasing trims idle buffers back
        under the cap. Calling the release twice is harmless.
        """
        with self._lock:
            self.max_idle_bytes += nbytes
        held = True

        def release() -> None:
            nonlocal held
            with self._lock:
                if not held:
                    return
                held = False
                self.max_idle_bytes -= nbytes
                while self._idle and self._idle_bytes > self.max_idle_bytes:
                    self._idle_bytes -= self._idle.pop().numel()

        return release

    @property
    def idle_bytes(self) -> int:
        with self._lock:
            return self._idle_bytes

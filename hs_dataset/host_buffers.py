"""Host buffers reused once the last tensor over them is gone (a leaf: torch only).

Memory the process has not touched before costs a page fault per 4 KiB on first use,
more than the copy into it. Two places churn through such memory: the SGLang client
reads every dump into a buffer, and the shard writer holds each sample until its shard
is written. With both leasing from pools, the client's buffer goes back as soon as the
writer has copied the sample into its own (reused) memory, and the writer's goes back
when the shard is on disk (benchmarks/bench_staging_pool.py measures the client's read
both ways; bench_transport.py the whole path).

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

import torch

__all__ = ["HostBufferPool", "in_a_lease"]

_GRANULARITY = 1 << 20  # buffers are whole MiBs, so nearby sizes share them

_leases_lock = threading.Lock()
_lease_starts: list[int] = []  # sorted start addresses of every live lease, of every pool
_lease_ends: dict[int, int] = {}


def in_a_lease(t: torch.Tensor) -> bool:
    """Whether ``t``'s memory lies in a live lease of some pool: memory its pool wants back soon."""
    address = t.data_ptr()
    with _leases_lock:
        i = bisect.bisect_right(_lease_starts, address) - 1
        return i >= 0 and address < _lease_ends[_lease_starts[i]]


def _register(start: int, nbytes: int) -> None:
    with _leases_lock:
        bisect.insort(_lease_starts, start)
        _lease_ends[start] = start + nbytes


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
        _register(buffer.data_ptr(), nbytes)
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

    @property
    def idle_bytes(self) -> int:
        with self._lock:
            return self._idle_bytes

"""Device -> host copies that do not stall the forward pass (stdlib + torch only).

* CPU tensors (CPU servers): a copy by the forward thread alone into a pooled buffer
  (the forward reuses its buffers), bounded like the pinned pool.
* CUDA tensors: a device-side snapshot (``clone``) on the *current* stream -- fast, and
  ordered before anything the next forward writes into the same (e.g. CUDA-graph
  static) buffers -- then an asynchronous copy into a pinned host buffer on a side
  stream, with an event the writer thread waits on. ``record_stream`` keeps the
  snapshot alive until the side stream is done. Pinned memory comes from a bounded
  :class:`PinnedPool`; if no buffer frees up within the forward's wait budget the
  caller refuses the request instead of blocking.
* Tensors the caller made for this copy (``owned``, e.g. the fp8 states the capture
  core quantized on the device) skip the device snapshot: nothing else writes them.

:func:`host_bytes` exposes a host tensor's memory as a memoryview without a copy, so
the dump writer can hand the pinned buffer straight to ``os.writev``.
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Collection, Mapping

import torch

__all__ = ["HostPiece", "PinnedPool", "HostCopier", "host_bytes"]

_ALIGN = 256


def _round(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def host_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous host tensor as a flat memoryview, without copying them.

    Why not ``t.numpy()``: float8 and bfloat16 have no numpy dtype, and numpy is not
    needed on the server otherwise. The view keeps the tensor alive (the ctypes array
    it exports holds a reference), but a pooled pinned buffer may be reused once its
    :class:`HostPiece` is released: use the view before that.
    """
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError(f"host_bytes needs a contiguous CPU tensor, got {t.device} contiguous={t.is_contiguous()}")
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return memoryview(b"")
    array = (ctypes.c_ubyte * nbytes).from_address(t.data_ptr())
    array._hs_owner = t  # the memory must outlive every view of it
    return memoryview(array).cast("B")


def _layout(tensors: Mapping[str, torch.Tensor]) -> tuple[list[tuple[str, int, int]], int]:
    """(name, offset, nbytes) of each tensor in one buffer, each aligned; and the buffer's size."""
    layout, offset = [], 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        layout.append((name, offset, nbytes))
        offset = _round(offset + nbytes, _ALIGN)
    return layout, offset


class PinnedPool:
    """A bounded pool of reusable host buffers (uint8): pinned for device copies, plain for CPU snapshots."""

    def __init__(self, max_bytes: int, *, granularity: int = 2 << 20, pin_memory: bool = True) -> None:
        self.max_bytes = int(max_bytes)
        self._gran = granularity
        self._pin = pin_memory
        self._free: list[torch.Tensor] = []
        self._total = 0
        self._cond = threading.Condition()

    def acquire(self, nbytes: int, timeout: float) -> torch.Tensor | None:
        size = _round(max(nbytes, 1), self._gran)
        if size > self.max_bytes:
            return None
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while True:
                fits = [i for i, b in enumerate(self._free) if b.numel() >= size]
                if fits:  # popped by position: list.remove would compare tensors with ==, element by element
                    return self._free.pop(min(fits, key=lambda i: self._free[i].numel()))
                # Drop free buffers that are too small to make room for a new one.
                while self._free and self._total + size > self.max_bytes:
                    self._total -= self._free.pop(0).numel()
                if self._total + size <= self.max_bytes:
                    self._total += size
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 0.02))
        return torch.empty(size, dtype=torch.uint8, pin_memory=self._pin)

    def release(self, buf: torch.Tensor) -> None:
        with self._cond:
            self._free.append(buf)
            self._cond.notify_all()


class HostPiece:
    """Host copies of some named tensors, ready after :meth:`wait`; :meth:`release` frees pinned memory."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], event=None, pool: PinnedPool | None = None, buf=None) -> None:
        self._tensors = dict(tensors)
        self._event = event
        self._pool = pool
        self._buf = buf

    def wait(self) -> dict[str, torch.Tensor]:
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        return self._tensors

    def release(self) -> None:
        self._tensors = {}
        if self._pool is not None and self._buf is not None:
            self._pool.release(self._buf)
        self._buf = None


class HostCopier:
    """Snapshot tensors to host memory; see the module docstring."""

    def __init__(self, pinned_pool_bytes: int = 2 << 30) -> None:
        self._pool_bytes = int(pinned_pool_bytes)
        self._pool: PinnedPool | None = None  # pinned, for device copies
        self._cpu_pool: PinnedPool | None = None  # plain memory, for CPU snapshots
        self._side_streams: dict = {}

    def _host_snapshot(self, tensors: Mapping[str, torch.Tensor], timeout: float) -> HostPiece | None:
        """CPU tensors copied into one pooled buffer by the calling thread alone.

        Why a pool: memory the process has not touched costs a page fault per 4 KiB, more
        than the copy; the buffer comes back when the dump is written. Why not ``clone``:
        torch splits a large clone over its intra-op threads, about twice the CPU of one
        ``memmove`` for the same wall time, taken from the cores the forward needs and
        missing from the forward thread's own CPU time, which the dump reports
        (``capture_cpu_ns``).
        """
        layout, size = _layout(tensors)
        if self._cpu_pool is None:
            self._cpu_pool = PinnedPool(self._pool_bytes, pin_memory=False)
        buf = self._cpu_pool.acquire(size, timeout)
        if buf is None:
            return None
        host: dict[str, torch.Tensor] = {}
        for name, off, nbytes in layout:
            src = tensors[name].detach()
            dst = buf[off : off + nbytes].view(src.dtype).view(src.shape)
            if not src.is_contiguous():
                dst.copy_(src)
            elif nbytes:
                ctypes.memmove(dst.data_ptr(), src.data_ptr(), nbytes)
            host[name] = dst
        return HostPiece(host, pool=self._cpu_pool, buf=buf)

    def _side_stream(self, device):
        stream = self._side_streams.get(device)
        if stream is None:
            stream = self._side_streams[device] = torch.cuda.Stream(device=device)
        return stream

    def snapshot(self, tensors: Mapping[str, torch.Tensor], timeout: float, *, owned: Collection[str] = ()) -> HostPiece | None:
        """Return a :class:`HostPiece`, or None when no pinned memory freed up within ``timeout``.

        ``owned``: names of tensors that were made for this copy (no later kernel
        writes them), copied without a device snapshot first.
        """
        devices = {t.device for t in tensors.values()}
        if all(d.type == "cpu" for d in devices):
            return self._host_snapshot(tensors, timeout)
        if len(devices) != 1 or next(iter(devices)).type != "cuda":
            # Unusual devices: a synchronous copy is correct everywhere.
            return HostPiece({k: t.detach().to("cpu", copy=True).contiguous() for k, t in tensors.items()})
        device = next(iter(devices))
        if self._pool is None:
            self._pool = PinnedPool(self._pool_bytes)
        layout, offset = _layout(tensors)
        buf = self._pool.acquire(offset, timeout)
        if buf is None:
            return None
        current = torch.cuda.current_stream(device)
        side = self._side_stream(device)
        snapshots = {  # on the current stream
            k: t.detach().contiguous() if k in owned else t.detach().contiguous().clone() for k, t in tensors.items()
        }
        side.wait_stream(current)
        host: dict[str, torch.Tensor] = {}
        with torch.cuda.stream(side):
            for name, off, nbytes in layout:
                src = snapshots[name]
                dst = buf[off : off + nbytes].view(src.dtype).view(src.shape)
                dst.copy_(src, non_blocking=True)
                src.record_stream(side)
                host[name] = dst
            event = torch.cuda.Event()
            event.record(side)
        return HostPiece(host, event=event, pool=self._pool, buf=buf)

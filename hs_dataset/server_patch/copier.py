"""Device -> host copies that do not stall the forward pass (stdlib + torch only).

* CPU tensors (CPU servers): a copy by the forward thread alone into a pooled buffer
  (the forward reuses its buffers), bounded like the pinned pool.
* CUDA tensors: a device-side snapshot (``clone``) on the *current* stream -- fast, and
  ordered before anything the next forward writes into the same (e.g. CUDA-graph
  static) buffers -- then copies into pinned host memory issued a slice at a time by
  the device's :class:`~hs_dataset.server_patch.copy_pump.CopyPump` thread, which the
  writer thread waits on (why slices: see that module). Pinned memory comes from a
  bounded :class:`PinnedPool`, one slab pinned once; if no range frees up within the
  forward's wait budget the caller refuses the request instead of blocking.
* Tensors the caller made for this copy (``owned``, e.g. the fp8 states the capture
  core quantized on the device) skip the device snapshot: nothing else writes them.
* A decode step's rows (``on_stream``, at most :data:`DIRECT_MAX_BYTES`) skip both the
  snapshot and the pump: the copy is queued on the current stream straight into pinned
  memory, so anything later on that stream (the next step's writes into the same
  static buffers) waits for it, and a blocking-sync event tells the waiting thread
  when it landed. Why: a decode step's snapshot, its pump job and the pump thread's
  Python cost the scheduler process more than the copy itself (the 2026-12-07 GPU
  profile, docs/GPU.md); a copy of a few MB holds back the next kernels on the stream
  for tens of microseconds, in a decode loop whose GPU waits for the CPU anyway. Not
  for prefill passes: their states (up to GBs) would hold back the pass's own sampled
  tokens, which is what the pump is for.

:func:`host_bytes` exposes a host tensor's memory as a memoryview without a copy, so
the dump writer can hand the pinned buffer straight to ``os.writev``.
"""

from __future__ import annotations

import bisect
import ctypes
import threading
import time
from collections.abc import Collection, Mapping

import torch

from hs_dataset.libc import name_os_thread
from hs_dataset.server_patch.copy_pump import CopyPump

__all__ = ["HostCopier", "HostPiece", "PinnedPool", "host_bytes", "to_device"]

_ALIGN = 256
DIRECT_MAX_BYTES = 16 << 20  # on_stream copies up to this size go on the current stream (see the module docstring)


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


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor (an index, positions) on ``device`` without the forward thread waiting for the device.

    Why: ``t.to(cuda)`` from pageable memory synchronizes the current stream (torch's copy waits for it to finish),
    so the forward thread would wait for every kernel queued before it; from pinned memory the copy is queued like
    any other (torch keeps the pinned block until it has landed).
    """
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def _host_view(buf: torch.Tensor, offset: int, nbytes: int, like: torch.Tensor) -> torch.Tensor:
    """``nbytes`` of the byte buffer ``buf`` from ``offset`` as a tensor of ``like``'s dtype and shape."""
    return buf[offset : offset + nbytes].view(like.dtype).view(like.shape)


def _layout(tensors: Mapping[str, torch.Tensor]) -> tuple[list[tuple[str, int, int]], int]:
    """(name, offset, nbytes) of each tensor in one buffer, each aligned; and the buffer's size."""
    layout, offset = [], 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        layout.append((name, offset, nbytes))
        offset = _round(offset + nbytes, _ALIGN)
    return layout, offset


class PinnedPool:
    """A bounded pool of host memory (uint8 views of one slab): pinned for device copies, plain for CPU snapshots.

    Why one slab, allocated once: pinning memory (``cudaHostAlloc``/``cudaHostRegister``)
    is slow and stalls the thread that asks, so per request it would stall the forward
    pass (docs/GPU.md, "The real server's cost of capture"). The slab is pinned once, ideally at server start
    (:meth:`prepare`), and requests take ranges of it (best fit, neighbours merged on
    release). Its size is exactly ``max_bytes``: registered with ``cudaHostRegister``,
    not allocated by torch's pinned allocator, which rounds up to a power of two.
    """

    def __init__(self, max_bytes: int, *, granularity: int = 2 << 20, pin_memory: bool = True) -> None:
        self.max_bytes = int(max_bytes)
        self._gran = granularity
        self._pin = pin_memory
        self._slab: torch.Tensor | None = None
        self._registered = False
        self._free: list[tuple[int, int]] = []  # (offset, size) of the free ranges, by offset
        self._cond = threading.Condition()
        self._in_use = 0
        self.peak_bytes = 0  # most of the slab ever handed out at once

    def prepare(self) -> None:
        """Allocate (and pin) the slab now, so no request pays for it."""
        with self._cond:
            self._ensure_slab()

    def _ensure_slab(self) -> None:
        if self._slab is not None or self.max_bytes <= 0:
            return
        slab = torch.empty(self.max_bytes, dtype=torch.uint8)
        if self._pin and torch.cuda.is_available():
            code = torch.cuda.cudart().cudaHostRegister(slab.data_ptr(), self.max_bytes, 0)
            if int(getattr(code, "value", code)) != 0:
                raise RuntimeError(f"cudaHostRegister of {self.max_bytes} bytes failed with error {code}")
            self._registered = True
        self._slab = slab
        self._free = [(0, self.max_bytes)]

    def acquire(self, nbytes: int, timeout: float) -> torch.Tensor | None:
        """A view of ``nbytes`` (rounded up) of the slab, or None when no range freed up within ``timeout``."""
        size = _round(max(nbytes, 1), self._gran)
        if size > self.max_bytes:
            return None
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            self._ensure_slab()
            while True:
                fits = [i for i, (_, free) in enumerate(self._free) if free >= size]
                if fits:
                    i = min(fits, key=lambda j: self._free[j][1])  # best fit: big ranges stay whole for big requests
                    offset, free = self._free[i]
                    if free == size:
                        del self._free[i]
                    else:
                        self._free[i] = (offset + size, free - size)
                    self._in_use += size
                    self.peak_bytes = max(self.peak_bytes, self._in_use)
                    return self._slab[offset : offset + size]
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 0.02))

    def release(self, buf: torch.Tensor) -> None:
        """Give a range from :meth:`acquire` back, merged with free neighbours."""
        with self._cond:
            if self._slab is None:
                raise ValueError("release of a buffer this pool never handed out")
            offset, size = buf.data_ptr() - self._slab.data_ptr(), buf.numel()
            if offset < 0 or offset + size > self.max_bytes:
                raise ValueError("release of a buffer this pool never handed out")
            i = bisect.bisect_left(self._free, (offset, 0))
            before = self._free[i - 1] if i > 0 else None
            after = self._free[i] if i < len(self._free) else None
            if (before and before[0] + before[1] > offset) or (after and offset + size > after[0]):
                raise ValueError(f"range {offset}+{size} released twice")
            self._in_use -= size
            if after and offset + size == after[0]:
                size += after[1]
                del self._free[i]
            if before and before[0] + before[1] == offset:
                offset, size = before[0], before[1] + size
                i -= 1
                del self._free[i]
            self._free.insert(i, (offset, size))
            self._cond.notify_all()

    def is_pinned(self) -> bool:
        with self._cond:
            return self._slab is not None and self._slab.is_pinned()

    def free_bytes(self) -> int:
        with self._cond:
            return sum(size for _, size in self._free) if self._slab is not None else self.max_bytes

    def close(self) -> None:
        """Unpin the slab (its memory goes when the last view of it does)."""
        with self._cond:
            if self._registered and self._slab is not None:
                torch.cuda.cudart().cudaHostUnregister(self._slab.data_ptr())
                self._registered = False


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
        """Give the host memory back, once no copy still lands in it (a dropped request's copies may be in flight)."""
        if self._event is not None:
            try:
                self._event.synchronize()
            except RuntimeError:
                pass  # the copy failed: nothing lands any more
            self._event = None
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
        self._pumps: dict = {}  # device -> CopyPump

    def prepare_pinned(self) -> float:
        """Pin the device-copy pool now (server start); seconds it took."""
        started = time.monotonic()
        if self._pool is None:
            self._pool = PinnedPool(self._pool_bytes)
        self._pool.prepare()
        return time.monotonic() - started

    @property
    def peak_bytes(self) -> int:
        """Most host memory the copies ever held at once, in either pool (bounded by ``pinned_pool_bytes``)."""
        return max((pool.peak_bytes for pool in (self._pool, self._cpu_pool) if pool is not None), default=0)

    def pinned_slab_is_pinned(self) -> bool:
        """Whether torch sees the device-copy pool as page-locked (else its "asynchronous" copies would block)."""
        return self._pool is not None and self._pool.is_pinned()

    def close(self) -> None:
        """Stop the pump threads and unpin the slab; a later snapshot starts both afresh."""
        pumps, self._pumps = self._pumps, {}
        for pump in pumps.values():
            pump.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def _host_snapshot(self, tensors: Mapping[str, torch.Tensor], timeout: float) -> HostPiece | None:
        """CPU tensors copied into one pooled buffer by the calling thread alone.

        Why a pool: memory the process has not touched costs a page fault per 4 KiB, more
        than the copy; the buffer comes back when the dump is written. Why not ``clone``:
        torch splits a large clone over its intra-op threads, more CPU than one
        ``memmove`` for about the same wall time, taken from the cores the forward needs and
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
            dst = _host_view(buf, off, nbytes, src)
            if not src.is_contiguous():
                dst.copy_(src)
            elif nbytes:
                ctypes.memmove(dst.data_ptr(), src.data_ptr(), nbytes)
            host[name] = dst
        return HostPiece(host, pool=self._cpu_pool, buf=buf)

    def _pump(self, device) -> CopyPump:
        pump = self._pumps.get(device)
        if pump is None:
            pump = self._pumps[device] = CopyPump(device, name_thread=name_os_thread)
        return pump

    def snapshot(
        self, tensors: Mapping[str, torch.Tensor], timeout: float, *, owned: Collection[str] = (), on_stream: bool = False
    ) -> HostPiece | None:
        """Return a :class:`HostPiece`, or None when no pinned memory freed up within ``timeout``.

        ``owned``: names of tensors that were made for this copy (no later kernel
        writes them), copied without a device snapshot first. ``on_stream``: a decode
        step's rows, copied on the current stream where small (see the module docstring).
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
        if on_stream and offset <= DIRECT_MAX_BYTES:
            return self._direct(tensors, layout, buf)
        snapshots = {  # on the current stream, before anything the next forward writes
            k: t.detach().contiguous() if k in owned else t.detach().contiguous().clone() for k, t in tensors.items()
        }
        host: dict[str, torch.Tensor] = {}
        pairs = []
        for name, off, nbytes in layout:
            src = snapshots[name]
            host[name] = _host_view(buf, off, nbytes, src)
            pairs.append((src, host[name]))
        done = self._pump(device).submit(pairs)
        return HostPiece(host, event=done, pool=self._pool, buf=buf)

    def _direct(self, tensors: Mapping[str, torch.Tensor], layout: list[tuple[str, int, int]], buf: torch.Tensor) -> HostPiece:
        """A small copy queued on the current stream straight into ``buf`` (pinned), no device snapshot, no pump."""
        host: dict[str, torch.Tensor] = {}
        for name, off, nbytes in layout:
            src = tensors[name].detach()
            host[name] = dst = _host_view(buf, off, nbytes, src)
            dst.copy_(src, non_blocking=True)
        landed = torch.cuda.Event(blocking=True)  # the thread that waits sleeps instead of spinning
        landed.record()
        return HostPiece(host, event=landed, pool=self._pool, buf=buf)

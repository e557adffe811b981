"""Device-to-host copies issued a slice at a time by one thread, so the server's own copies never queue behind ours.

Runs inside SGLang scheduler processes (stdlib and torch only). Why: a GPU has few copy
engines, and a copy waits for the ones queued on its engine before it, whatever its
stream. SGLang ends every prefill pass with a small device-to-host copy (the sampled
tokens) that the scheduler waits for; queued behind a pass's states (about 1 GB for
16k Kimi-wide tokens) it would make every pass longer by the time those take to cross
PCIe (docs/GPU.md has the measurement). Here at most ``in_flight``
slices of ``slice_bytes`` are queued at any time, so the server's copy waits for well
under a millisecond, and the copy engine still runs back to back.

The thread waits on CUDA events (which releases the GIL) and holds the device tensors
of each job until its last slice has landed, so their memory cannot be reused early.
The events are blocking-sync ones, so the wait sleeps: with spinning ones the pump took
20-22 s of CPU per 50-59 s build in the 2026-12-07 GPU profile (docs/GPU.md). Tensors
smaller than a slice share one: a job records an event per ``slice_bytes`` copied, not
one per tensor.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Sequence

import torch

__all__ = ["CopyDone", "CopyPump"]

logger = logging.getLogger("hs_dataset.server_patch")

SLICE_BYTES = 32 << 20
IN_FLIGHT = 2


class CopyDone:
    """Set once a job's copies have landed in host memory; :meth:`synchronize` waits for it (as a CUDA event would)."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self.error: str | None = None

    def set(self, error: str | None = None) -> None:
        self.error = error
        self._done.set()

    def synchronize(self) -> None:
        self._done.wait()
        if self.error is not None:
            raise RuntimeError(f"device-to-host copy failed: {self.error}")


class _Job:
    __slots__ = ("done", "pairs", "ready")

    def __init__(self, pairs: list[tuple[torch.Tensor, torch.Tensor]], ready, done: CopyDone) -> None:
        self.pairs = pairs  # (device source, host destination), both contiguous, same bytes
        self.ready = ready  # CUDA event on the forward stream: the sources are complete
        self.done = done


class CopyPump:
    """One thread per device that copies jobs' tensors to host memory in slices, a few in flight."""

    def __init__(
        self,
        device: torch.device,
        *,
        slice_bytes: int = SLICE_BYTES,
        in_flight: int = IN_FLIGHT,
        name_thread: Callable[[str], None] | None = None,
    ) -> None:
        self.device = device
        self.slice_bytes = int(slice_bytes)
        self.in_flight = max(1, int(in_flight))
        self._stream = torch.cuda.Stream(device=device)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._name_thread = name_thread
        self._thread = threading.Thread(target=self._loop, name="hs-d2h-pump", daemon=True)
        self._thread.start()

    def submit(self, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> CopyDone:
        """Queue copies of device tensors that are complete once the current stream gets here; returns at once."""
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(self.device))
        done = CopyDone()
        self._jobs.put(_Job(list(pairs), ready, done))
        return done

    def close(self, timeout: float = 10.0) -> None:
        self._jobs.put(None)
        self._thread.join(timeout)

    def _loop(self) -> None:
        if self._name_thread is not None:
            self._name_thread("hs-d2h-pump")
        torch.cuda.set_device(self.device)
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                self._copy(job)
                job.done.set()
            except Exception as exc:  # reported by the writer that waits on it, as a refusal of that request
                logger.exception("hs_dataset capture: device-to-host copy failed")
                job.done.set(f"{type(exc).__name__}: {exc}")
            finally:
                job.pairs = []  # the device tensors may be reused now: every slice has landed (or failed)

    def _copy(self, job: _Job) -> None:
        pending: deque = deque()
        queued = 0  # bytes copied since the last event
        self._stream.wait_event(job.ready)
        with torch.cuda.stream(self._stream):
            for src, dst in job.pairs:
                src_bytes, dst_bytes = src.reshape(-1).view(torch.uint8), dst.reshape(-1).view(torch.uint8)
                for start in range(0, src_bytes.numel(), self.slice_bytes):
                    stop = min(start + self.slice_bytes, src_bytes.numel())
                    if queued and queued + stop - start > self.slice_bytes:  # no more than a slice between events
                        self._landed(pending)
                        queued = 0
                    dst_bytes[start:stop].copy_(src_bytes[start:stop], non_blocking=True)
                    queued += stop - start
            if queued:
                self._landed(pending)
        while pending:
            pending.popleft().synchronize()

    def _landed(self, pending: deque) -> None:
        """An event after the copies queued so far; waits for the oldest while ``in_flight`` are pending."""
        landed = torch.cuda.Event(blocking=True)
        landed.record(self._stream)
        pending.append(landed)
        if len(pending) >= self.in_flight:
            pending.popleft().synchronize()

"""The staging budget: the bytes and files waiting for the client, bounded, re-read by a background meter.

Stdlib only (runs inside SGLang scheduler processes). The capture core reserves room
on the forward thread before a copy and commits or releases it from the writer
threads; the usage on disk comes from a callable (:meth:`StagingDir.usage
<hs_dataset.server_patch.staging.StagingDir.usage>`) because other processes share
the directory (other DP ranks) and the client deletes files.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["FAR_SCANS", "StagingBudget"]

FAR_SCANS = 4  # the meter's interval, in rescan intervals, while less than half of either bound is used


class StagingBudget:
    """Bounded staging: bytes and files waiting for the client, plus writes in flight.

    ``reserve`` is called on the forward thread before a copy; it waits at most
    ``timeout`` for the client to drain the directory and returns False if the budget is
    still exceeded (the caller then writes a refusal marker -- the forward pass is never
    blocked longer than that). Usage on disk is re-read from the directory (other
    processes, e.g. other DP ranks, may share it and the client deletes files).

    Who re-reads it: with :meth:`start_meter`, a background thread, every
    ``rescan_interval_s`` (every ``FAR_SCANS`` of them while less than half of either bound
    is used: what another process may add meanwhile is then far from filling it), and at
    once (then at most every ``poll_s``) while a reservation waits for room, so the
    forward thread never scans. A scan stats every
    file waiting in the directory, each stat handing the GIL back -- time the forward
    pass would wait, long once another thread wants the GIL (see docs/BENCHMARKS.md).
    Without the meter (unit tests, tools) ``reserve`` scans itself.
    """

    def __init__(
        self,
        max_bytes: int,
        max_files: int,
        usage: Callable[[], tuple[int, int]],
        *,
        rescan_interval_s: float = 0.25,
        poll_s: float = 0.02,
    ) -> None:
        self.max_bytes = int(max_bytes)
        self.max_files = int(max_files)
        self._usage = usage
        self._rescan_interval_s = rescan_interval_s
        self._poll_s = poll_s
        self._cond = threading.Condition()
        self._inflight_bytes = 0
        self._inflight_files = 0
        self.peak_bytes = 0  # most bytes ever reserved or waiting at once, as this process counted them
        self._disk_bytes = 0
        self._disk_files = 0
        self._scanned_at = float("-inf")
        self._meter: threading.Thread | None = None
        self._meter_stop = False
        self._rescan_wanted = False  # a reservation waits for room: the meter scans now, then every poll_s
        self._scan_lock = threading.Lock()
        self._committed_in_scan: tuple[int, int] | None = None  # during a meter scan: what was committed since it began

    # ------------------------------------------------------------------ the meter
    def start_meter(self, name_thread: Callable[[str], None] = lambda _name: None) -> None:
        """Re-read the directory's usage from a background thread from now on (see the class docstring)."""
        with self._cond:
            if self._meter is not None:
                return
            self._meter_stop = False
            self._meter = threading.Thread(target=self._meter_loop, args=(name_thread,), name="hs-staging-meter", daemon=True)
        self.refresh()  # the first figures before any reservation relies on them
        self._meter.start()

    def stop_meter(self, timeout: float = 5.0) -> None:
        """Stop the meter (before the directory it reads is closed); ``reserve`` scans itself again."""
        with self._cond:
            meter, self._meter_stop = self._meter, True
            self._cond.notify_all()
        if meter is not None:
            meter.join(timeout)
        with self._cond:
            self._meter = None

    def _meter_loop(self, name_thread: Callable[[str], None]) -> None:
        name_thread("hs-staging-meter")
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._meter_stop or self._rescan_wanted, timeout=self._meter_interval_locked())
                # at most one scan per poll_s, however often a waiting reservation asks
                self._cond.wait_for(lambda: self._meter_stop, timeout=max(0.0, self._scanned_at + self._poll_s - time.monotonic()))
                if self._meter_stop:
                    return
            try:
                self.refresh()
            except OSError:  # the directory is gone or closing: the figures stay as they were
                pass

    def _meter_interval_locked(self) -> float:
        """The time to the meter's next scan: longer while the directory is far from its bounds (the scans cost the GIL)."""
        far = (
            2 * (self._disk_bytes + self._inflight_bytes) < self.max_bytes
            and 2 * (self._disk_files + self._inflight_files) < self.max_files
        )
        return self._rescan_interval_s * (FAR_SCANS if far else 1)

    def refresh(self) -> None:
        """Re-read the usage on disk without holding the lock, so reservations and commits go on meanwhile.

        A file committed while the scan ran is added to what the scan found: the scan may
        have missed it. If it also saw it, the file counts twice until the next scan --
        an over-count, which only makes the budget stricter for a moment.
        """
        with self._scan_lock:  # one scan at a time: each owns the count of commits made during it
            with self._cond:
                self._committed_in_scan, self._rescan_wanted = (0, 0), False
            try:
                disk_bytes, disk_files = self._usage()
            except BaseException:
                with self._cond:
                    self._committed_in_scan = None
                raise
            with self._cond:
                late_bytes, late_files = self._committed_in_scan
                self._committed_in_scan = None
                self._disk_bytes, self._disk_files = disk_bytes + late_bytes, disk_files + late_files
                self._scanned_at = time.monotonic()
                self._cond.notify_all()

    # ------------------------------------------------------------------ reservations
    def _rescan_locked(self) -> None:
        self._disk_bytes, self._disk_files = self._usage()
        self._scanned_at = time.monotonic()

    def _fits_locked(self, nbytes: int, nfiles: int) -> bool:
        return (
            self._disk_bytes + self._inflight_bytes + nbytes <= self.max_bytes
            and self._disk_files + self._inflight_files + nfiles <= self.max_files
        )

    def reserve(self, nbytes: int, timeout: float, *, nfiles: int = 1) -> bool:
        if nbytes > self.max_bytes or nfiles > self.max_files:
            return False
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            metered = self._meter is not None
            if not metered and time.monotonic() - self._scanned_at > self._rescan_interval_s:
                self._rescan_locked()
            while True:
                if self._fits_locked(nbytes, nfiles):
                    self._inflight_bytes += nbytes
                    self._inflight_files += nfiles
                    self.peak_bytes = max(self.peak_bytes, self._disk_bytes + self._inflight_bytes)
                    return True
                if not metered:
                    self._rescan_locked()
                    if self._fits_locked(nbytes, nfiles):
                        continue
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if metered:
                    self._rescan_wanted = True
                    self._cond.notify_all()
                self._cond.wait(min(self._poll_s, left))

    def committed(self, nbytes: int, nfiles: int = 1) -> None:
        """The reserved bytes are now a file on disk (counted there until the next rescan)."""
        with self._cond:
            self._inflight_bytes -= nbytes
            self._inflight_files -= nfiles
            self._disk_bytes += nbytes
            self._disk_files += nfiles
            if self._committed_in_scan is not None:
                late_bytes, late_files = self._committed_in_scan
                self._committed_in_scan = (late_bytes + nbytes, late_files + nfiles)
            self._cond.notify_all()

    def release(self, nbytes: int, nfiles: int = 1) -> None:
        """Give back a reservation that produced no file."""
        with self._cond:
            self._inflight_bytes -= nbytes
            self._inflight_files -= nfiles
            self._cond.notify_all()

    def snapshot(self) -> dict:
        with self._cond:
            return {
                "inflight_bytes": self._inflight_bytes,
                "inflight_files": self._inflight_files,
                "disk_bytes": self._disk_bytes,
                "disk_files": self._disk_files,
            }

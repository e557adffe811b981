"""The capture core's status file (``server_patch/contract/status.py``), kept current by a background thread.

The forward thread only bumps counters (the core's ``stats``) and appends request ids to
short deques (appends are atomic under the GIL); this thread copies them and rewrites
the file when something changed, at most every ``STATUS_INTERVAL_S``, and at least every
``STATUS_HEARTBEAT_S`` even when nothing did: ``counted_at`` is taken when the counters are
copied, so a reader knows which passes the file can speak for -- "no prefill reached the
hooks since my request" needs a reading taken after it, which a quiet server must still give.

Each write also carries the CPU time of capture's own threads (``cpu_ms_<thread>``, the
threads that name themselves ``hs-...``) and of the whole process (``cpu_ms_process``), as
counts: they share the process, and its GIL, with SGLang's scheduler, so a benchmark reads
what capture cost the server from two readings. They do not count as a change: a quiet
server's file is still rewritten only at the heartbeat.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from hs_dataset.server_patch.contract.status import RECENT_IDS, STATUS_HEARTBEAT_S, STATUS_INTERVAL_S, write_status

__all__ = ["StatusReporter", "ThreadCpu"]

logger = logging.getLogger("hs_dataset.server_patch")


class StatusReporter:
    """One writer's status: the facts it was started with, the core's counters, the last request ids of each kind."""

    def __init__(
        self, staging_dir: str, writer: str, stats: Mapping[str, int], facts: Mapping[str, Any], identity: Mapping[str, Any]
    ) -> None:
        self.staging_dir = staging_dir
        self.writer = writer
        self._stats = stats
        self._static = {"pid": os.getpid(), "started": time.time(), "facts": dict(facts), **identity}
        self.recent_foreign: deque[str] = deque(maxlen=RECENT_IDS)
        self.recent_dumps: deque[str] = deque(maxlen=RECENT_IDS)
        self.recent_refused: deque[str] = deque(maxlen=RECENT_IDS)
        self.last_error: str | None = None
        self.last_unusable: str | None = None  # why the last prefill pass's states could not be used
        self._last: tuple | None = None
        self._written_at = 0.0
        self._cpu = ThreadCpu()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def fact(self, name: str, value: Any) -> None:
        """Change one fact after start (the decode-graph route learns its outcome once SGLang has captured its graphs)."""
        self._static["facts"] = {**self._static["facts"], name: value}
        self._last = None  # rewritten at the next tick even if no counter moved

    def error(self, message: str) -> None:
        self.last_error = message[:500]

    def unusable(self, reason: str) -> None:
        self.last_unusable = reason[:500]

    def write(self) -> None:
        """Rewrite the file now if anything changed since the last write."""
        counts = dict(self._stats)
        lists = (tuple(self.recent_foreign), tuple(self.recent_dumps), tuple(self.recent_refused))
        state = (tuple(sorted(counts.items())), lists, self.last_error, self.last_unusable)
        if state == self._last and time.monotonic() - self._written_at < STATUS_HEARTBEAT_S:
            return
        write_status(
            self.staging_dir,
            self.writer,
            {
                **self._static,
                "counted_at": time.time(),
                "counts": {**counts, **self._cpu.read()},
                "recent_foreign": list(lists[0]),
                "recent_dumps": list(lists[1]),
                "recent_refused": list(lists[2]),
                "last_error": self.last_error,
                "last_unusable": self.last_unusable,
            },
        )
        self._last = state
        self._written_at = time.monotonic()

    def start(self, name_thread: Callable[[str], None] | None = None) -> None:
        self.write()

        def loop() -> None:
            if name_thread is not None:
                name_thread("hs-dump-status")
            while not self._stop.wait(STATUS_INTERVAL_S):
                self._write_quietly()

        self._thread = threading.Thread(target=loop, name="hs-dump-status", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._write_quietly()

    def _write_quietly(self) -> None:
        try:
            self.write()
        except OSError as exc:  # a full or vanished staging dir: the dumps will say so; the status must not stop capture
            logger.warning("hs_dataset capture: cannot write the status file in %s: %s", self.staging_dir, exc)


_THREAD_PREFIX = "hs-"  # capture's threads name themselves so (libc.name_os_thread)
NAMES_REFRESH_S = 5.0  # every thread's name is read again this often (a thread may name itself after it was first read)


class ThreadCpu:
    """The CPU time of the process and of capture's threads, reading ``/proc`` for capture's threads only.

    Why a cache: an SGLang scheduler process runs dozens of threads, and reading every one's
    name at each status write (every ``STATUS_INTERVAL_S``) cost the reporter about 1% of a core
    and 2% of the samples holding the GIL in the lent H100's profile (docs/GPU.md). Names are read
    once per thread id, and every ``NAMES_REFRESH_S`` again, so a thread that names itself after
    its first reading is counted from then on (its CPU count is cumulative: nothing is lost).
    """

    def __init__(self, refresh_s: float = NAMES_REFRESH_S) -> None:
        self._refresh_s = refresh_s
        self._names: dict[str, str | None] = {}  # task dir -> capture thread's name, None for another thread
        self._read_at = float("-inf")

    def read(self) -> dict[str, int]:
        """``cpu_ms_process`` and ``cpu_ms_<name>`` of each of capture's threads by name (Linux; elsewhere the process's only)."""
        found = {"cpu_ms_process": int(sum(os.times()[:2]) * 1000)}
        try:
            tasks = [task.path for task in os.scandir("/proc/self/task")]
            tick = os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError):  # not Linux
            return found
        now = time.monotonic()
        if now - self._read_at >= self._refresh_s:
            self._names, self._read_at = {}, now
        names = {task: self._names[task] if task in self._names else _capture_thread_name(task) for task in tasks}
        self._names = names  # threads gone since are forgotten
        for task, name in names.items():
            ms = _thread_cpu_ms(task, tick) if name is not None else None
            if ms is not None:
                key = f"cpu_ms_{name}"
                found[key] = found.get(key, 0) + ms
        return found


def _capture_thread_name(task: str) -> str | None:
    """The name of one of capture's threads; None for another thread, or one gone while read."""
    try:
        with open(f"{task}/comm") as f:
            name = f.read().strip()
    except OSError:
        return None
    return name if name.startswith(_THREAD_PREFIX) else None


def _thread_cpu_ms(task: str, tick: int) -> int | None:
    """CPU ms of one thread (user + system); None for a thread gone while read."""
    try:
        with open(f"{task}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the name, in parentheses, may hold spaces
        return (int(fields[11]) + int(fields[12])) * 1000 // tick
    except (OSError, ValueError, IndexError):
        return None

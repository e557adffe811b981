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

__all__ = ["StatusReporter", "cpu_ms"]

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
                "counts": {**counts, **cpu_ms()},
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


def cpu_ms() -> dict[str, int]:
    """CPU milliseconds of this process and of each of capture's threads by name (Linux /proc; elsewhere the process's only)."""
    found = {"cpu_ms_process": int(sum(os.times()[:2]) * 1000)}
    try:
        tasks = list(os.scandir("/proc/self/task"))
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):  # not Linux
        return found
    for task in tasks:
        reading = _thread_cpu(task.path, tick)
        if reading is not None:
            key = f"cpu_ms_{reading[0]}"
            found[key] = found.get(key, 0) + reading[1]
    return found


def _thread_cpu(task: str, tick: int) -> tuple[str, int] | None:
    """(name, CPU ms) of one of capture's threads; None for another thread, or one gone while read."""
    try:
        with open(f"{task}/comm") as f:
            name = f.read().strip()
        if not name.startswith(_THREAD_PREFIX):
            return None
        with open(f"{task}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the name, in parentheses, may hold spaces
        return name, (int(fields[11]) + int(fields[12])) * 1000 // tick
    except (OSError, ValueError, IndexError):
        return None

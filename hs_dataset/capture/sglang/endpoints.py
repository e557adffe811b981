"""The servers a capture client spreads its requests over: each one's health and load, and which to send to next."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Endpoint", "EndpointPicker"]

MAX_COOLDOWN_S = 60.0  # a server failing again and again is still retried this often
MAX_WAIT_S = 30.0  # the longest a sample waits for a server to come back before trying anyway


@dataclass
class Endpoint:
    """One server: its URL, its staging directory and its health."""

    url: str
    staging_dir: str | None = None
    version: str | None = None
    uses_rids: bool = True
    mechanism: str | None = None  # how its hooks capture (a Mechanism's value), from their config
    server_info: dict = field(default_factory=dict)
    inflight: int = 0
    failures: int = 0
    down_until: float = 0.0
    served: int = 0
    identity: dict | None = None  # model, version, aux layers when first trusted (capture/sglang/recheck.py)
    recheck: bool = False  # failed since: read /server_info again before trusting its next answer
    retired: str | None = None  # came back as a different server: out of rotation for the run, and why

    def available(self, now: float) -> bool:
        return self.retired is None and now >= self.down_until

    def mark_down(self, cooldown_s: float) -> None:
        """Out of rotation for a while: the cooldown doubles with each failure in a row (up to 16x, at most a minute).

        It may come back restarted as another server: it is read again before its next request (``recheck``).
        """
        self.failures += 1
        self.recheck = True
        self.down_until = time.monotonic() + min(MAX_COOLDOWN_S, cooldown_s * (2 ** min(self.failures - 1, 4)))


class EndpointPicker:
    """The least loaded available server, ties broken round-robin, avoiding the ones a sample already failed on."""

    def __init__(self) -> None:
        self._turn = itertools.count()

    def pick(self, endpoints: Sequence[Endpoint], avoid: set[str]) -> Endpoint | None:
        """An available server not in ``avoid`` (any available one if all are); ``None`` when all are down."""
        now = time.monotonic()
        ready = [e for e in endpoints if e.available(now) and e.url not in avoid] or [e for e in endpoints if e.available(now)]
        if not ready:
            return None
        start = next(self._turn)
        ordered = ready[start % len(ready) :] + ready[: start % len(ready)]
        return min(ordered, key=lambda e: e.inflight)

    async def pick_or_wait(self, endpoints: Sequence[Endpoint], avoid: set[str]) -> Endpoint | None:
        """:meth:`pick`; when every server is down, wait for the first to come back (at most 30 s) and pick again."""
        ep = self.pick(endpoints, avoid)
        if ep is None:
            waiting = [e.down_until for e in endpoints if e.retired is None]
            if not waiting:  # every server came back as another one: nothing to wait for
                return None
            wait = min(waiting) - time.monotonic()
            await asyncio.sleep(max(0.0, min(wait, MAX_WAIT_S)))
            ep = self.pick(endpoints, set())
        return ep

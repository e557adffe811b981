"""Async HTTP plumbing shared by the capture client and the generator: one loop thread, one session shape."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

__all__ = ["LoopThread", "new_session"]


class LoopThread:
    """An asyncio loop on a daemon thread, for driving aiohttp from synchronous code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="hs-sglang-client", daemon=True)
        self._thread.start()

    def submit(self, coro) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro, timeout: float | None = None):
        return self.submit(coro).result(timeout)

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self.loop.is_running():
            self.loop.close()


def new_session(concurrency: int, timeout_s: float) -> Any:
    """An aiohttp session sized for ``concurrency`` requests in flight (twice that many sockets)."""
    import aiohttp

    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=max(8, concurrency * 2)),
        timeout=aiohttp.ClientTimeout(total=timeout_s),
    )

"""Async HTTP plumbing shared by the capture client and the generator: one loop thread, one session shape, JSON requests."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from typing import Any

__all__ = ["LoopThread", "new_session", "HTTPStatusError", "connection_errors", "get_status", "get_json", "post_generate"]


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


class HTTPStatusError(Exception):
    """A server answered, but not 200; ``text`` is its whole answer, for the messages that quote it."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text[:200]}")
        self.status = status
        self.text = text


def connection_errors() -> tuple[type[BaseException], ...]:
    """What a request raises when the server cannot be reached or does not answer in time (aiohttp imported late)."""
    import aiohttp

    return (aiohttp.ClientError, asyncio.TimeoutError, OSError)


async def get_status(session: Any, url: str, timeout_s: float) -> int:
    """The HTTP status of a GET (its body is not read)."""
    import aiohttp

    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        return resp.status


async def get_json(session: Any, url: str, timeout_s: float = 10.0) -> Any:
    """A GET's JSON answer (``None`` for an empty one); :class:`HTTPStatusError` unless it answered 200."""
    import aiohttp

    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        text = await resp.text()
        if resp.status != 200:
            raise HTTPStatusError(resp.status, text)
        return json.loads(text) if text.strip() else None


async def post_generate(session: Any, server: str, body: dict[str, Any], timeout_s: float) -> dict:
    """POST ``body`` to the server's ``/generate``; its JSON answer, or :class:`HTTPStatusError` unless it answered 200."""
    import aiohttp

    async with session.post(server + "/generate", json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        text = await resp.text()
        if resp.status != 200:
            raise HTTPStatusError(resp.status, text)
        return json.loads(text)

"""Async HTTP plumbing shared by the capture client and the generator: one loop thread, one session shape, JSON requests.

Every answer is read within bounds: the status first, then at most ``max_bytes`` of body in
64 KiB chunks (an endless or huge body is refused, never buffered whole), then its content
type, UTF-8 and JSON, each refused in one line naming the URL.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from typing import Any

from hs_dataset import strict_json
from hs_dataset.errors import CaptureError

__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "BadResponseError",
    "HTTPStatusError",
    "LoopThread",
    "connection_errors",
    "get_json",
    "new_session",
    "parse_json",
    "post_generate",
    "post_json",
    "read_body",
]


_UNWIND_S = 5.0  # how long a closing client waits for its cancelled requests to unwind


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

    def cancel_pending(self, timeout: float = _UNWIND_S) -> int:
        """Cancel every task still on the loop and wait (at most ``timeout``) until they have unwound, on the loop.

        Why: a build stopped by Ctrl-C or SIGTERM closed its clients with requests in flight.
        Their session was closed under them (a one-pass capture then "fell back to prefill"
        during the shutdown: ``Server disconnected``) and the loop stopped with their tasks
        pending; the garbage collector finished them later, off the loop, and the stopped
        build printed ``Event loop is closed`` and ``Task was destroyed but it is pending!``
        tracebacks after its one line. Call it before closing what the tasks use. Returns how many tasks it cancelled.
        """
        if not self.loop.is_running():
            return 0
        try:
            return int(self.run(_cancel_others(), timeout))
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError, RuntimeError):
            return 1  # a task that ignores its cancellation: stop() stops the loop under it, as before

    def stop(self) -> None:
        self.cancel_pending()
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self.loop.is_running():
            self.loop.close()


async def _cancel_others() -> int:
    """Cancel every other task of the running loop and wait until each has finished (its cleanup runs here, on the loop)."""
    current = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return len(tasks)


# An idle connection is closed by us before the server closes it: SGLang's uvicorn closes one idle for 5 s
# (SGLANG_TIMEOUT_KEEP_ALIVE, 0.5.14-0.5.23), aiohttp keeps one for 15 s by default, and a request sent on a
# connection the server is closing fails with "Server disconnected" (seen on the CPU server: the final-token
# repairs of a build's last conversations, on the connections its probe had opened, failed so).
KEEPALIVE_S = 2.0


def new_session(concurrency: int, timeout_s: float) -> Any:
    """An aiohttp session sized for ``concurrency`` requests in flight (twice that many sockets)."""
    import aiohttp

    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=max(8, concurrency * 2), keepalive_timeout=KEEPALIVE_S),
        timeout=aiohttp.ClientTimeout(total=timeout_s),
    )


DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024  # the card's backend.max_response_bytes default
ERROR_TEXT_BYTES = 64 * 1024  # of a non-200 answer, only this much is read (for the message)
_CHUNK = 64 * 1024
_JSON_TYPES = ("application/json",)


class HTTPStatusError(CaptureError):
    """A server answered, but not 200; ``text`` is the start of its answer, for the messages that quote it."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {' '.join(text[:200].split())}")
        self.status = status
        self.text = text


class BadResponseError(CaptureError):
    """A server answered 200 with a body we refuse: too large, not UTF-8, not JSON, or the wrong content type."""


def connection_errors() -> tuple[type[BaseException], ...]:
    """What a request raises when the server cannot be reached or does not answer in time (aiohttp imported late)."""
    import aiohttp

    return (aiohttp.ClientError, asyncio.TimeoutError, OSError)


async def read_body(resp: Any, limit: int, where: str) -> bytes:
    """At most ``limit`` bytes of ``resp``'s body, read in bounded chunks; :class:`BadResponseError` beyond that."""
    announced = resp.content_length
    too_big = f"{where}: the answer is over {limit} bytes (backend.max_response_bytes); is this an SGLang server?"
    if announced is not None and announced > limit:
        raise BadResponseError(too_big)
    chunks, total = [], 0
    async for chunk in resp.content.iter_chunked(_CHUNK):
        total += len(chunk)
        if total > limit:
            raise BadResponseError(too_big)  # leaving the response unread closes its connection
        chunks.append(chunk)
    return b"".join(chunks)


async def _error_text(resp: Any) -> str:
    data = await resp.content.read(ERROR_TEXT_BYTES)
    return data.decode("utf-8", errors="replace")


def parse_json(data: bytes, content_type: str, where: str) -> Any:
    """A 200 answer's JSON (``None`` for an empty one), refused in one line when it is not UTF-8 JSON."""
    if not data.strip():
        return None
    if content_type not in _JSON_TYPES and not content_type.endswith("+json"):
        raise BadResponseError(f"{where}: answered content type {content_type!r}, not JSON; is this an SGLang server?")
    try:
        return strict_json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BadResponseError(f"{where}: the answer is not UTF-8 (byte {exc.start}); is this an SGLang server?") from None
    except json.JSONDecodeError as exc:
        raise BadResponseError(f"{where}: the answer is not JSON ({exc.msg} at byte {exc.pos}); is this an SGLang server?") from None
    except RecursionError:
        raise BadResponseError(f"{where}: the answer is JSON nested too deeply to read; is this an SGLang server?") from None


async def _json_answer(resp: Any, where: str, max_bytes: int) -> Any:
    if resp.status != 200:
        raise HTTPStatusError(resp.status, await _error_text(resp))
    return parse_json(await read_body(resp, max_bytes, where), resp.content_type, where)


async def get_json(session: Any, url: str, timeout_s: float = 10.0, max_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> Any:
    """A GET's JSON answer (``None`` for an empty one); :class:`HTTPStatusError` unless 200, :class:`BadResponseError` for a bad body."""
    import aiohttp

    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        return await _json_answer(resp, url, max_bytes)


async def post_json(session: Any, url: str, body: dict[str, Any], timeout_s: float, max_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> Any:
    """POST ``body`` as JSON; the answer as :func:`get_json` reads it."""
    import aiohttp

    async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        return await _json_answer(resp, url, max_bytes)


async def post_generate(
    session: Any, server: str, body: dict[str, Any], timeout_s: float, max_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
) -> dict:
    """POST ``body`` to the server's ``/generate``; its JSON object, or :class:`HTTPStatusError` / :class:`BadResponseError`."""
    out = await post_json(session, server + "/generate", body, timeout_s, max_bytes)
    if not isinstance(out, dict):
        raise BadResponseError(f"{server}/generate: the answer is a JSON {type(out).__name__}, not an object; is this an SGLang server?")
    return out

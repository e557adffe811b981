"""Generation through the capture server's own ``/generate`` endpoint, many requests in flight.

The same server that captures also writes the regenerated turns. Its capture hook
stores only requests whose id starts with the run prefix (``hs-``, see
``sglang/server/core.py``: any other rid is counted ``foreign_skipped`` and never
dumped), so generation requests use ``gen-<run>-<seq>`` ids: nothing is staged for
them. The server runs with ``--skip-tokenizer-init``, so prompts go as token ids and
answers come back as ``output_ids``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
from typing import Any, Sequence

from hs_dataset.regenerate.generator import GenerationParams, GenerationResult, Generator, finish_of
from hs_dataset.sglang.client.http import LoopThread, new_session

__all__ = ["GEN_RID_PREFIX", "SGLangGenerator"]

GEN_RID_PREFIX = "gen-"  # never the capture prefix (which must start with "hs-")


class SGLangGenerator(Generator):
    """Continue prompts on SGLang servers, ``concurrency`` requests in flight (spread over ``urls``)."""

    def __init__(
        self, urls: Sequence[str], *, concurrency: int = 16, request_timeout_s: float = 600.0, retries: int = 2,
        model_fingerprint: str = "", run_id: str | None = None,
    ) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        if not self.urls:
            raise ValueError("SGLangGenerator needs at least one server URL (backend.urls in the card, or --server URL)")
        self.concurrency = int(concurrency)
        self.request_timeout_s = float(request_timeout_s)
        self.retries = int(retries)
        self.model_fingerprint = model_fingerprint
        self.run_id = run_id or secrets.token_hex(6)
        self._seq = itertools.count(1)
        self._loop: LoopThread | None = None
        self._session = None
        self._server_info: dict[str, Any] = {}

    def describe(self) -> dict[str, Any]:
        info = self._server_info or self._run(self._get_json(self.urls[0] + "/server_info"))
        self._server_info = info or {}
        return {
            "engine": "sglang", "version": self._server_info.get("version"), "servers": list(self.urls),
            "served_model": self._server_info.get("model_path"), "model_fingerprint": self.model_fingerprint,
            "dtype": self._server_info.get("dtype"), "concurrency": self.concurrency,
        }

    def generate(self, prompts: Sequence[list[int]], params: GenerationParams) -> list[GenerationResult]:
        if not prompts:
            return []

        async def run_all() -> list[GenerationResult]:
            gate = asyncio.Semaphore(self.concurrency)

            async def one(k: int, prompt: list[int]) -> GenerationResult:
                async with gate:
                    return await self._one(self.urls[k % len(self.urls)], prompt, params)

            return list(await asyncio.gather(*(one(k, p) for k, p in enumerate(prompts))))

        return self._run(run_all())

    def body(self, prompt: list[int], params: GenerationParams) -> dict[str, Any]:
        """The ``/generate`` request for one prompt (also what a plain reference request sends)."""
        sampling: dict[str, Any] = {
            "max_new_tokens": params.max_new_tokens, "temperature": params.temperature, "top_p": params.top_p,
            "stop_token_ids": list(params.stop_token_ids),
        }
        if params.temperature > 0:
            sampling["sampling_seed"] = params.seed
        return {"rid": f"{GEN_RID_PREFIX}{self.run_id}-{next(self._seq)}", "input_ids": list(prompt), "sampling_params": sampling}

    async def _one(self, url: str, prompt: list[int], params: GenerationParams) -> GenerationResult:
        import aiohttp

        error = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(0.5 * 2 ** (attempt - 1))
            try:
                out = await self._post(url + "/generate", self.body(prompt, params))
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, _Status) as exc:
                error = f"{url}/generate: {type(exc).__name__}: {exc}"
                continue
            return parse_output(out, params)
        return GenerationResult([], "failed", error)

    # ------------------------------------------------------------------ plumbing
    def _run(self, coro: Any) -> Any:
        if self._loop is None:
            self._loop = LoopThread()
        return self._loop.run(coro)

    async def _get_session(self):
        if self._session is None or self._session.closed:
            self._session = new_session(self.concurrency, self.request_timeout_s)
        return self._session

    async def _post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        session = await self._get_session()
        async with session.post(url, json=body) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise _Status(f"HTTP {resp.status}: {text[:300]}")
            return json.loads(text)

    async def _get_json(self, url: str) -> dict[str, Any]:
        session = await self._get_session()
        async with session.get(url) as resp:
            return json.loads(await resp.text()) if resp.status == 200 else {}

    def close(self) -> None:
        if self._loop is None:
            return
        if self._session is not None:
            try:
                self._loop.run(self._session.close(), timeout=10)
            except Exception:  # noqa: BLE001 - closing a session on shutdown
                pass
            self._session = None
        self._loop.stop()
        self._loop = None


class _Status(Exception):
    """A non-200 answer (retried like a connection error)."""


def parse_output(out: dict[str, Any], params: GenerationParams) -> GenerationResult:
    """``/generate``'s answer -> ids with the stop token that ended them, and why they ended."""
    ids = [int(t) for t in out.get("output_ids") or []]
    reason = (out.get("meta_info") or {}).get("finish_reason") or {}
    matched = reason.get("matched") if isinstance(reason, dict) else None
    if isinstance(reason, dict) and reason.get("type") == "stop" and isinstance(matched, int) and (not ids or ids[-1] != matched):
        ids.append(matched)  # the server trimmed the stop token it matched: the model did write it
    if isinstance(reason, dict) and reason.get("type") == "abort":
        return GenerationResult(ids, "failed", str(reason.get("message", "aborted by the server")))
    return GenerationResult(ids, finish_of(ids, params))

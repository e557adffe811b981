"""Generation through the capture server's own ``/generate`` endpoint, many requests in flight.

The same server that captures also writes the regenerated turns. Its capture hook
stores only requests whose id starts with the run prefix (``hs-``, see
``server_patch/core.py``: any other rid is counted ``foreign_skipped`` and never
dumped), so generation requests use ``gen-<run>-<seq>`` ids: nothing is staged for
them. The server runs with ``--skip-tokenizer-init``, so prompts go as token ids and
answers come back as ``output_ids``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from hs_dataset.capture.sglang.attempts import Action, Attempts, Verdict, connection_verdict, http_status_verdict, retry_pause
from hs_dataset.capture.sglang.endpoints import Endpoint, EndpointPicker
from hs_dataset.capture.sglang.http import (
    DEFAULT_MAX_RESPONSE_BYTES,
    BadResponseError,
    HTTPStatusError,
    LoopThread,
    connection_errors,
    get_json,
    new_session,
    post_json,
)
from hs_dataset.capture.sglang.recheck import recheck_endpoint
from hs_dataset.formats.vocabulary import describe_outside, outside_vocabulary
from hs_dataset.regenerate.generator import GenerationParams, GenerationResult, OnePassTrace, StreamingGenerator, finish_of
from hs_dataset.server_patch.contract.rid import make_one_pass_rid

__all__ = ["GEN_RID_PREFIX", "SGLangGenerator", "parse_output"]

GEN_RID_PREFIX = "gen-"  # never the capture prefix (which must start with "hs-")


class SGLangGenerator(StreamingGenerator):
    """Continue prompts on SGLang servers: each request goes to the least loaded healthy one.

    ``concurrency``: requests :meth:`generate` keeps in flight, and the :attr:`in_flight`
    the engine keeps (``SGLangBackend.generator`` sizes it from what the servers report,
    ``capacity.py``). A request that fails on a server (no connection, a timeout, HTTP
    5xx or 429) takes that server out of rotation for ``cooldown_s`` (doubling while it
    keeps failing) and is sent to another, so a slow or dead server does not stall the
    run; ``retries`` more attempts are allowed after one per server. Its ``/server_info``
    is read before its first request and again before the first one after a failure; a
    server that came back with another model, version or aux layers is taken out of
    rotation for the run (``recheck.py``).
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        concurrency: int = 16,
        request_timeout_s: float = 600.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        cooldown_s: float = 5.0,
        model_fingerprint: str = "",
        vocab_size: int | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        in_flight_source: str = "",
        one_pass_run: str | None = None,
        run_seq: Iterator[int] | None = None,
    ) -> None:
        """``one_pass_run``: capture each generation's states as the server computes them, under one-pass
        request ids of this run (``hs-<run>-<seq>-g<T>``); None: plain generation requests. ``run_seq``: the
        run's request counter, shared with everything else that sends requests of that run (the capture
        backend's repairs), so that no two requests ever carry one id (two counters of one run collided)."""
        self.one_pass_run = one_pass_run
        self.abandoned: list[OnePassTrace] = []  # one-pass attempts that failed: their pieces are nobody's
        self.endpoints = [Endpoint(url=u.rstrip("/")) for u in urls]
        if not self.endpoints:
            raise ValueError("SGLangGenerator needs at least one server URL (backend.urls in the card, or --server URL)")
        self.urls = [e.url for e in self.endpoints]
        self.concurrency = self.in_flight = int(concurrency)
        self.in_flight_source = in_flight_source or "set by the caller"
        self.request_timeout_s = float(request_timeout_s)
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)
        self.cooldown_s = float(cooldown_s)
        self.model_fingerprint = model_fingerprint
        self.vocab_size = vocab_size
        self.max_response_bytes = int(max_response_bytes)
        self.run_id = secrets.token_hex(6)
        self._seq = run_seq if run_seq is not None else itertools.count(1)
        self._picker = EndpointPicker()
        self._loop: LoopThread | None = None
        self._session = None
        self._server_info: dict[str, Any] = {}

    def describe(self) -> dict[str, Any]:
        info = self._server_info or self._run(self._get_json(self.urls[0] + "/server_info"))
        self._server_info = info if isinstance(info, dict) else {}
        return {
            "engine": "sglang",
            "version": self._server_info.get("version"),
            "servers": list(self.urls),
            "served_model": self._server_info.get("model_path"),
            "model_fingerprint": self.model_fingerprint,
            "dtype": self._server_info.get("dtype"),
            "concurrency": self.in_flight,
            "concurrency_from": self.in_flight_source,
        }

    def submit(self, prompt: list[int], params: GenerationParams) -> concurrent.futures.Future[GenerationResult]:
        if self._loop is None:
            self._loop = LoopThread()
        return self._loop.submit(self._generate_one(list(prompt), params))

    def generate(self, prompts: Sequence[list[int]], params: GenerationParams) -> list[GenerationResult]:
        if not prompts:
            return []

        async def run_all() -> list[GenerationResult]:
            gate = asyncio.Semaphore(self.concurrency)

            async def one(prompt: list[int]) -> GenerationResult:
                async with gate:
                    return await self._generate_one(prompt, params)

            return list(await asyncio.gather(*(one(p) for p in prompts)))

        return self._run(run_all())

    def body(self, prompt: list[int], params: GenerationParams) -> dict[str, Any]:
        """The ``/generate`` request for one prompt (also what a plain reference request sends)."""
        sampling: dict[str, Any] = {
            "max_new_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stop_token_ids": list(params.stop_token_ids),
        }
        if params.temperature > 0:
            sampling["sampling_seed"] = params.seed
        seq = next(self._seq)
        rid = make_one_pass_rid(self.one_pass_run, seq, len(prompt)) if self.one_pass_run else f"{GEN_RID_PREFIX}{self.run_id}-{seq}"
        return {"rid": rid, "input_ids": list(prompt), "sampling_params": sampling}

    async def _generate_one(self, prompt: list[int], params: GenerationParams) -> GenerationResult:
        """Attempts on the servers until one answers, or the attempts run out (a failed turn naming the last reason)."""
        tries = Attempts(retries=self.retries, servers=len(self.endpoints))
        for attempt in range(tries.total):
            if attempt:
                await asyncio.sleep(retry_pause(self.backoff_s, attempt))
            ep = await self._picker.pick_or_wait(self.endpoints, tries.avoid)
            if ep is None:
                tries.last_reason = next((e.retired for e in self.endpoints if e.retired), None) or "every SGLang server is unreachable"
                continue
            changed = await self._same_server(ep)
            if changed is not None:
                ep.mark_down(self.cooldown_s)
                if not tries.record(changed, ep.url):
                    break
                continue
            ep.inflight += 1
            body = self.body(prompt, params)
            try:
                out = await self._post(ep.url + "/generate", body)
            except HTTPStatusError as exc:
                verdict = http_status_verdict(ep.url + "/generate", exc)
            except (BadResponseError, *connection_errors()) as exc:
                verdict = connection_verdict(ep.url + "/generate", exc)
            else:
                ep.failures = 0
                return self._traced(parse_output(out, params, self.vocab_size), out, body["rid"], ep.url)
            finally:
                ep.inflight -= 1
            if self.one_pass_run:
                self.abandoned.append(OnePassTrace(body["rid"], ep.url))
            if verdict.action is Action.ELSEWHERE:
                ep.mark_down(self.cooldown_s)
            if not tries.record(verdict, ep.url):
                break
        return GenerationResult([], "failed", tries.last_reason)

    async def _same_server(self, ep: Endpoint) -> Verdict | None:
        """None when ``ep`` is the server first trusted (read again after a failure); else why not, as a failed attempt."""
        try:
            changed = await recheck_endpoint(ep, await self._get_session(), self.request_timeout_s, self.max_response_bytes)
        except connection_errors() as exc:
            return connection_verdict(ep.url + "/server_info", exc)
        return None if changed is None else Verdict(Action.ELSEWHERE, changed, abandon=False, counter=None)

    def _traced(self, result: GenerationResult, out: Any, rid: str, url: str) -> GenerationResult:
        """A one-pass generation's result with where its states are (a failed one's pieces are abandoned)."""
        if not self.one_pass_run:
            return result
        trace = OnePassTrace(rid, url, _cached_tokens(out))
        if result.finish == "failed":
            self.abandoned.append(trace)
            return result
        return replace(result, trace=trace)

    # ------------------------------------------------------------------ plumbing
    def _run(self, coro: Any) -> Any:
        if self._loop is None:
            self._loop = LoopThread()
        return self._loop.run(coro)

    async def _get_session(self):
        if self._session is None or self._session.closed:
            self._session = new_session(self.concurrency, self.request_timeout_s)
        return self._session

    async def _post(self, url: str, body: dict[str, Any]) -> Any:
        return await post_json(await self._get_session(), url, body, self.request_timeout_s, self.max_response_bytes)

    async def _get_json(self, url: str) -> Any:
        """``/server_info`` for the manifest's description; an unreadable one describes nothing."""
        try:
            return await get_json(await self._get_session(), url, self.request_timeout_s, self.max_response_bytes)
        except (HTTPStatusError, BadResponseError, *connection_errors()):
            return {}

    def close(self) -> None:
        if self._loop is None:
            return
        self._loop.cancel_pending()  # generations still in flight (a stopped build) unwind before the session goes
        if self._session is not None:
            try:
                self._loop.run(self._session.close(), timeout=10)
            except Exception:  # noqa: BLE001 - closing a session on shutdown
                pass
            self._session = None
        self._loop.stop()
        self._loop = None


def _cached_tokens(out: Any) -> int | None:
    """``meta_info.cached_tokens`` of an answer: prompt tokens served from the prefix cache (None: not said)."""
    meta = out.get("meta_info") if isinstance(out, dict) else None
    value = meta.get("cached_tokens") if isinstance(meta, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _bad_ids(ids: Any, vocab_size: int | None) -> str | None:
    """Why ``output_ids`` are not token ids of this model, or None.

    The range and its wording are the package's one vocabulary check (``formats/vocabulary.py``): without a
    known ``vocab_size`` ids stay below the largest vocabulary a model may have, which also keeps them in int64.
    """
    if not isinstance(ids, list):
        return f"output_ids is a {type(ids).__name__}, not a list"
    for i, t in enumerate(ids):
        if not isinstance(t, int) or isinstance(t, bool):
            return f"output_ids[{i}] is a {type(t).__name__} ({t!r:.20}), not a token id"
    found = outside_vocabulary(ids, vocab_size)
    return None if found is None else describe_outside(found, vocab_size, "output_ids")


def parse_output(out: Any, params: GenerationParams, vocab_size: int | None = None) -> GenerationResult:
    """``/generate``'s answer -> ids with the stop token that ended them, and why they ended.

    An answer that is not an object, or whose ``output_ids`` are not this model's token ids (strings, floats,
    ids outside ``[0, vocab_size)``, or above any model's vocabulary when it is not known), is a failed turn with a one-line reason, never stored.
    """
    if not isinstance(out, dict):
        return GenerationResult([], "failed", f"the server answered a JSON {type(out).__name__}, not an object")
    ids = out.get("output_ids") or []
    problem = _bad_ids(ids, vocab_size)
    if problem is not None:
        return GenerationResult([], "failed", f"the server's answer is not token ids: {problem}")
    ids = list(ids)
    meta = out.get("meta_info") or {}
    reason = (meta.get("finish_reason") if isinstance(meta, dict) else None) or {}
    matched = reason.get("matched") if isinstance(reason, dict) else None
    if (
        isinstance(reason, dict)
        and reason.get("type") == "stop"
        and isinstance(matched, int)
        and not isinstance(matched, bool)
        and _bad_ids([matched], vocab_size) is None
        and (not ids or ids[-1] != matched)
    ):
        ids.append(matched)  # the server trimmed the stop token it matched: the model did write it
    if isinstance(reason, dict) and reason.get("type") == "abort":
        return GenerationResult(ids, "failed", str(reason.get("message", "aborted by the server")))
    return GenerationResult(ids, finish_of(ids, params))

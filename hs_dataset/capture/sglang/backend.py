"""The SGLang capture client: samples -> ``/generate`` requests -> per-request dump files.

The server side (``hs-dataset serve``, :mod:`hs_dataset.server_patch`) writes one
``{rid}.safetensors`` per prefilled request into a private staging directory on the
same host; this client sends each sample's ``input_ids`` with a unique request id,
waits for that dump, checks it (token ids, shapes, dtype, layers), turns it into a
:class:`~hs_dataset.sample.CapturedSample` and deletes it. Anything else -- a refusal
marker, a missing or late dump, mismatched tokens, a server error after the
retries -- becomes a :class:`~hs_dataset.capture.base.CaptureFailure`, never a
partial sample. See docs/SGLANG.md.

Before any work, :meth:`SGLangBackend.validate` checks every server
(:mod:`~hs_dataset.capture.sglang.validate`). The parts: ``endpoints`` (which server
next), ``http`` (requests), ``dumps`` (reading and checking a dump), ``attempts``
(what a failure means for the next attempt).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import os
import secrets
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from hs_dataset.capture.base import CaptureBackend, CaptureFailure, CaptureInfo, CaptureResult, CaptureTarget
from hs_dataset.capture.sglang.attempts import (
    Action,
    Attempts,
    Verdict,
    connection_verdict,
    http_status_verdict,
    lost_dump_verdict,
    refusal_verdict,
    retry_pause,
)
from hs_dataset.capture.sglang.capacity import in_flight, prefill_tokens
from hs_dataset.capture.sglang.diagnose import GRACE_S, HookReport, diagnose, read_report
from hs_dataset.capture.sglang.dumps import DumpLost, ExpectedDump, Refusal, await_dump, delete_staged, prune_mappings, take_refusal
from hs_dataset.capture.sglang.endpoints import Endpoint, EndpointPicker
from hs_dataset.capture.sglang.generate import SGLangGenerator
from hs_dataset.capture.sglang.http import BadResponseError, HTTPStatusError, LoopThread, connection_errors, new_session, post_generate
from hs_dataset.capture.sglang.one_pass import Assembly, SharedPrefixes, Source
from hs_dataset.capture.sglang.one_pass_support import one_pass_blocker
from hs_dataset.capture.sglang.pieces import PieceError, PieceListing
from hs_dataset.capture.sglang.recheck import identity_of, recheck_endpoint
from hs_dataset.capture.sglang.support import verification
from hs_dataset.capture.sglang.validate import check_probe, check_server, probe_sample, server_mechanism
from hs_dataset.config import Card, RegenerateSection, SGLangBackendSection
from hs_dataset.dtypes import state_dtype
from hs_dataset.errors import ServerValidationError
from hs_dataset.model.model_config import read_model_config, text_config
from hs_dataset.model.snapshot import model_fingerprint, read_final_norm
from hs_dataset.model.weights import check_weights
from hs_dataset.regenerate.generator import ONE_PASS_META, Generator, TracedGeneration
from hs_dataset.sample import CapturedSample, TokenizedSample
from hs_dataset.server_patch.contract.dump import DUMP_SUFFIX, REFUSED_SUFFIX
from hs_dataset.server_patch.contract.rid import content_key, is_one_pass, make_one_pass_rid, make_rid
from hs_dataset.server_patch.contract.spares import hand_back_dump

__all__ = ["SGLangBackend"]

logger = logging.getLogger("hs_dataset.capture.sglang.backend")


class SGLangBackend(CaptureBackend):
    """Capture through one or more hs_dataset-enabled SGLang servers (see the module docstring).

    Args:
        section: the card's ``backend`` section (``name: sglang``): concurrency, timeouts,
            retries and back-off, ``max_new_tokens``, the radix-cache policy, the cooldown
            of a failing server, and the URLs and staging dir when not given here.
        target: the served model's local snapshot (for :meth:`info`: fingerprint,
            final-norm weight and eps; and to check the server serves the same model),
            the aux layers (must equal the server's) and the dtype (checked at the
            probe; ``None``: the server's).
        servers: server URLs (``http://host:port``); default ``section.urls``. Load is
            spread over them, and a failing one is out of rotation for a while.
        staging_dir: where dumps appear; default ``section.staging_dir``, else what each
            server reports in its hook config.
        probe: send a probe request to each server at validation.
        run_id: the request ids' run part; default a random one.
    """

    def __init__(
        self,
        section: SGLangBackendSection,
        target: CaptureTarget,
        *,
        servers: Sequence[str] | str | None = None,
        staging_dir: str | None = None,
        probe: bool = True,
        run_id: str | None = None,
    ) -> None:
        urls = [servers] if isinstance(servers, str) else list(servers or section.urls)
        urls = [s.rstrip("/") for s in urls if s]
        if not urls:
            raise ValueError("SGLangBackend needs at least one server URL (backend.urls in the card, or --server URL)")
        self.section = section
        self.endpoints = [Endpoint(url=u, staging_dir=staging_dir or section.staging_dir) for u in urls]
        self.model_path = str(target.model_path)
        self.aux_layer_ids = list(target.aux_layer_ids)
        self.dtype: torch.dtype | None = state_dtype(target.dtype) if target.dtype else None
        self.model_revision = target.model_revision
        self.concurrency = section.concurrency
        self.request_timeout_s = section.request_timeout_s
        self.probe = probe
        self.run_id = run_id or secrets.token_hex(6)
        self.stats = {"requests": 0, "retries": 0, "refused": 0, "timeouts": 0, "endpoint_errors": 0}
        self.stats.update(one_pass_samples=0, one_pass_fallbacks=0, one_pass_repairs=0, one_pass_repair_tokens=0, one_pass_shared_tokens=0)
        self._shared_prefixes = SharedPrefixes()
        self._listings: dict[str, PieceListing] = {}
        self.one_pass = False  # set by generator(): regenerated conversations are captured while generated
        self.one_pass_fallback_reasons: dict[str, int] = {}
        self._seq = itertools.count(1)
        self._picker = EndpointPicker()
        self._validated = False
        self._hidden_size: int | None = None
        self._local_config: dict | None = None
        self._info: CaptureInfo | None = None
        self._loop: LoopThread | None = None
        self._session = None
        self._abandoned: list[tuple[Endpoint, str]] = []
        self._reports: dict[str, tuple[float, HookReport]] = {}  # url -> (when read, the hooks' status)

    @classmethod
    def from_card(
        cls, card: Card, *, model_path: str | None = None, servers: Sequence[str] | None = None, batch_size: int | None = None
    ) -> SGLangBackend:
        """Build from a card (see docs/CARDS.md); the URL defaults to ``sglang.host``/``sglang.port``.

        ``batch_size`` (the pipeline's ``--batch-size``) overrides ``backend.concurrency``:
        it means requests in flight here.
        """
        section, sg = card.backend, card.sglang
        if not isinstance(section, SGLangBackendSection):
            raise ValueError(f"config {card.name!r} uses backend {section.name!r}; SGLangBackend needs `backend: {{name: sglang}}`")
        urls = list(servers or section.urls) or [f"http://{sg.host}:{sg.port}"]
        target = CaptureTarget.from_card(card, model_path=model_path)
        if batch_size:
            section = card.with_overrides(backend={"concurrency": int(batch_size)}).backend
        staging_dir = section.staging_dir or (sg.staging.dir if len(urls) == 1 else None)
        return cls(section, target, servers=urls, staging_dir=staging_dir)

    # ------------------------------------------------------------------ plumbing

    def _ensure_loop(self) -> LoopThread:
        if self._loop is None:
            self._loop = LoopThread()
        return self._loop

    async def _get_session(self):
        if self._session is None or self._session.closed:
            self._session = new_session(self.concurrency, self.request_timeout_s)
        return self._session

    def _forces_prefill(self, ep: Endpoint) -> bool:
        """Whether capture requests to ``ep`` make SGLang recompute every prompt token: as the card says, and by
        default wherever the server keeps its prefix cache (a regeneration server does: one pass needs it)."""
        if self.section.force_full_prefill is not None:
            return self.section.force_full_prefill
        return not self.section.allow_radix_cache and not ep.server_info.get("disable_radix_cache", True)

    async def _post_generate(self, ep: Endpoint, rid: str, ids: list[int], recompute_from: int | None = None) -> dict:
        """One capture request: greedy, ``max_new_tokens`` 0 or 1; positions from ``recompute_from`` on computed
        whatever the prefix cache holds (default: all of them where :meth:`_forces_prefill`)."""
        body: dict[str, Any] = {
            "rid": rid,
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": self.section.max_new_tokens, "temperature": 0.0},
        }
        if recompute_from is None and self._forces_prefill(ep):
            recompute_from = 0
        if recompute_from is not None:
            body["return_logprob"] = True
            body["logprob_start_len"] = int(recompute_from)
        return await post_generate(await self._get_session(), ep.url, body, self.request_timeout_s, self.section.max_response_bytes)

    # ------------------------------------------------------------------ validation

    def validate(self) -> None:
        """Check every server (see :mod:`~hs_dataset.capture.sglang.validate`); raises :class:`ServerValidationError`."""
        if self._validated:
            return
        loop = self._ensure_loop()
        problems = []
        limit = self.request_timeout_s + self.section.dump_timeout_s + 60
        for ep in self.endpoints:
            try:
                loop.run(self._validate_endpoint(ep), timeout=limit)
            except ServerValidationError as exc:
                problems.append(str(exc))
            except concurrent.futures.TimeoutError:
                problems.append(
                    f"SGLang server {ep.url}: the checks and the probe request did not finish within {limit:.0f} s "
                    "(backend.request_timeout_s + backend.dump_timeout_s + 60); see the server log"
                )
        if problems:
            raise ServerValidationError("\n".join(problems))
        self._validated = True

    async def _validate_endpoint(self, ep: Endpoint) -> None:
        session = await self._get_session()
        await check_server(ep, session, self.section, model_path=self.model_path, aux_layer_ids=self.aux_layer_ids, run_id=self.run_id)
        ep.identity, ep.recheck = identity_of(ep.server_info), False  # what a server back from a failure must still be
        if self.probe:
            await self._probe(ep)

    def _local_model_config(self) -> dict:
        """The local snapshot's text config, checked against its weights once (before the first probe).

        Not where every server says it loaded no weights (``--load-format dummy``, a
        throughput rehearsal): there is nothing the config could disagree with.
        """
        if not (Path(self.model_path) / "config.json").is_file():
            return {}
        if self._local_config is None:
            config = read_model_config(self.model_path)
            if not all(ep.server_info.get("load_format") == "dummy" for ep in self.endpoints):
                check_weights(self.model_path, config)
            self._local_config = dict(text_config(config))
        return self._local_config

    async def _probe(self, ep: Endpoint) -> None:
        """A short request whose dump must appear; it sets the hidden size, and the dtype when none was asked for.

        The local snapshot's config is checked against its weights first: the probe's
        token ids and the hidden size it expects come from it.
        """
        cfg = self._local_model_config()
        result = await self._capture_one(probe_sample(cfg.get("vocab_size")), endpoints=[ep])
        self._hidden_size, produced = check_probe(ep.url, result, cfg.get("hidden_size"), self.dtype)
        if self.dtype is None:
            self.dtype = produced

    # ------------------------------------------------------------------ one sample

    async def _capture_one(self, sample: TokenizedSample, *, endpoints: Sequence[Endpoint] | None = None) -> CaptureResult:
        """Attempts on the servers until the sample is captured or its failure is final (see :mod:`.attempts`)."""
        if sample.input_ids.numel() == 0:
            return CaptureFailure(sample.sample_id, "empty prompt")
        traced = sample.meta.get(ONE_PASS_META) if endpoints is None else None
        if traced:
            done = await self._capture_one_pass(sample, traced)
            if done is not None:
                return done
        result = await self._capture_by_prefill(sample, endpoints)
        if traced and isinstance(result, CapturedSample):
            result.capture_path = "prefill"
        return result

    async def _capture_by_prefill(self, sample: TokenizedSample, endpoints: Sequence[Endpoint] | None) -> CaptureResult:
        endpoints = list(endpoints or self.endpoints)
        ids = sample.input_ids.tolist()
        tries = Attempts(retries=self.section.retries, servers=len(endpoints))
        for attempt in range(tries.total):
            if attempt:
                self.stats["retries"] += 1
                await asyncio.sleep(retry_pause(self.section.backoff_s, attempt))
            ep = await self._picker.pick_or_wait(endpoints, tries.avoid)
            if ep is None:
                tries.last_reason = next((e.retired for e in endpoints if e.retired), None) or "every SGLang server is unreachable"
                continue
            outcome = await self._attempt(ep, sample, ids)
            if not isinstance(outcome, Verdict):
                return outcome
            if not tries.record(outcome, ep.url):
                break
        return tries.failure(sample.sample_id)

    async def _attempt(self, ep: Endpoint, sample: TokenizedSample, ids: list[int]) -> CaptureResult | Verdict:
        """One request on ``ep`` under a new request id; a failure comes back classified, and is counted."""
        rid = make_rid(self.run_id, next(self._seq), len(ids))
        key = rid if ep.uses_rids else content_key(sample.input_ids)
        ep.inflight += 1
        self.stats["requests"] += 1
        try:
            outcome = await self._request(ep, rid, key, sample, ids)
        except asyncio.CancelledError:  # a stopped build: the server may still write this request's dump
            self._abandon(ep, key)
            raise
        finally:
            ep.inflight -= 1
        if isinstance(outcome, Verdict):
            self._count(ep, key, outcome)
        return outcome

    async def _same_server(self, ep: Endpoint) -> Verdict | None:
        """None when ``ep`` is the server validated at start (read again after a failure); else why not, as a failed attempt."""
        if not ep.recheck and ep.retired is None:  # validated at start and not failed since
            return None
        session = await self._get_session()
        try:
            changed = await recheck_endpoint(ep, session, self.request_timeout_s, self.section.max_response_bytes)
        except connection_errors() as exc:
            return connection_verdict(ep.url + "/server_info", exc)
        return None if changed is None else Verdict(Action.ELSEWHERE, changed, abandon=False, counter="endpoint_errors")

    async def _request(self, ep: Endpoint, rid: str, key: str, sample: TokenizedSample, ids: list[int]) -> CaptureResult | Verdict:
        changed = await self._same_server(ep)
        if changed is not None:
            return changed
        before = self._hook_report(ep)
        try:
            await self._post_generate(ep, rid, ids)
        except HTTPStatusError as exc:
            return http_status_verdict(ep.url, exc)
        except (BadResponseError, *connection_errors()) as exc:  # a garbage answer: that server is taken out of rotation
            return connection_verdict(ep.url, exc)
        ep.failures = 0
        answered_at = time.time()

        def explain() -> str | None:
            after = self._hook_report(ep, fresh=True)
            return diagnose(ep.url, ep.staging_dir, key, rid, before, after, answered_at=answered_at, late_s=time.time() - answered_at)

        try:
            result = await self._await_dump(ep, key, sample, explain=explain)
        except DumpLost as exc:
            return lost_dump_verdict(exc)
        if isinstance(result, Refusal):
            return refusal_verdict(key, result)
        ep.served += 1
        return result

    # ------------------------------------------------------------------ one pass (see capture/sglang/one_pass.py)

    async def _capture_one_pass(self, sample: TokenizedSample, traced: Sequence[TracedGeneration]) -> CapturedSample | None:
        """The sample's states from the rows its generations left, repaired where none came; None: capture it by prefill."""
        by_url = {ep.url: ep for ep in self.endpoints}
        if any(by_url.get(g.trace.url) is None or not by_url[g.trace.url].staging_dir for g in traced):
            return self._one_pass_fallback(sample, "a generation ran on a server this backend does not capture on", [])
        sources = [Source.of_generation(g, str(by_url[g.trace.url].staging_dir), sample.input_ids) for g in traced]
        assembly = Assembly(sample, self._expected())
        ep = by_url[traced[-1].trace.url]  # the last generation's server: its prefix cache holds the sample
        n = sample.num_tokens
        # The last token's state: no generation computes it (sampled, never fed back), so its repair goes out at once,
        # beside the wait for the generations' pieces, not after it (one round trip less at the end of every sample).
        repairs = [asyncio.ensure_future(self._repair(assembly, sources, ep, n - 1, n))] if n > 1 else []
        try:
            problem = await self._gather(assembly, list(sources))  # the generations' pieces (each repair takes its own)
            ranges = []
            for start, stop in [] if problem else assembly.missing():
                if repairs:  # the last token's repair is under way
                    if start >= n - 1:
                        continue
                    stop = min(stop, n - 1)
                if self._shared_prefixes.fill(assembly, start, stop):
                    self.stats["one_pass_shared_tokens"] += stop - start
                    continue
                ranges.append((start, stop))
            repairs += [asyncio.ensure_future(self._repair(assembly, sources, ep, a, b)) for a, b in ranges]  # at once
            problems = await asyncio.gather(*repairs)
            problem = problem or next((p for p in problems if p), None)
        except (PieceError, ValueError) as exc:
            problem = str(exc)
        finally:
            for task in repairs:  # a piece that failed its check: the repairs still under way are not waited for
                task.cancel()
            await asyncio.gather(*repairs, return_exceptions=True)
            await asyncio.get_running_loop().run_in_executor(None, _clear, sources)
        if problem or assembly.missing():
            return self._one_pass_fallback(sample, problem or f"positions {assembly.missing()[:3]} never arrived", sources)
        self.stats["one_pass_samples"] += 1
        self._shared_prefixes.remember(assembly)
        result = assembly.result()
        result.capture_path = "one_pass"
        return result

    async def _gather(self, assembly: Assembly, sources: Sequence[Source]) -> str | None:
        """Take the sources' pieces until every position they must deliver is filled, or the dump timeout passes.

        Returns why one pass is given up (a refusal marker), else None (what is still missing is repaired).
        """
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self.section.dump_timeout_s
        delay = 0.002
        while True:
            for source in sources:
                for path in source.new_pieces(self._listing(source.staging_dir)):
                    source.seen.add(path)  # taken here, before the await: no other gather of this sample takes it too
                    await loop.run_in_executor(None, assembly.take, source, path)
                if os.path.lexists(source.refusal_path()):
                    return f"the server refused {source.rid}: {take_refusal(source.refusal_path()).reason}"
            if assembly.covers(sources) or time.monotonic() > deadline:
                return None
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.05)

    def _listing(self, staging_dir: str) -> PieceListing:
        """The shared piece listing of ``staging_dir`` (one per dir, used on the event loop's thread only)."""
        listing = self._listings.get(staging_dir)
        if listing is None:
            listing = self._listings[staging_dir] = PieceListing(staging_dir)
        return listing

    async def _repair(self, assembly: Assembly, sources: list[Source], ep: Endpoint, start: int, stop: int) -> str | None:
        """Have ``ep`` compute positions ``[start, stop)`` of the sample under a one-pass id; None when they arrived."""
        ids = assembly.sample.input_ids[:stop]
        rid = make_one_pass_rid(self.run_id, next(self._seq), stop)
        repair = Source.of_repair(rid, str(ep.staging_dir), assembly.sample.input_ids, start, stop)
        sources.append(repair)
        self.stats["one_pass_repairs"] += 1
        try:
            await self._post_generate(ep, rid, ids.tolist(), recompute_from=start)
        except (HTTPStatusError, BadResponseError, *connection_errors()) as exc:
            return f"the repair request for positions [{start}, {stop}) failed: {exc}"
        problem = await self._gather(assembly, [repair])
        self.stats["one_pass_repair_tokens"] += stop - start
        if problem is None and not bool(assembly.filled[start:stop].all()):
            filled = int(assembly.filled[start:stop].sum())
            return f"the repair of positions [{start}, {stop}) filled {filled} of them in {self.section.dump_timeout_s:.0f} s"
        return problem

    def _one_pass_fallback(self, sample: TokenizedSample, reason: str, sources: Sequence[Source]) -> None:
        """Count (and log the first few of) a conversation whose one-pass states are given up: it is captured by prefill."""
        self.stats["one_pass_fallbacks"] += 1
        first = reason.split(":")[0][:120]
        seen = self.one_pass_fallback_reasons.get(first, 0)
        self.one_pass_fallback_reasons[first] = seen + 1
        if seen < 3:
            logger.warning("one-pass capture of %s given up, captured by prefill instead: %s", sample.sample_id, reason)
        return None

    def _expected(self) -> ExpectedDump:
        return ExpectedDump(tuple(self.aux_layer_ids), self.dtype, self._hidden_size)

    def _count(self, ep: Endpoint, key: str, verdict: Verdict) -> None:
        """A failed attempt's traces: its stats counter, the server's cooldown, the dump that may still come."""
        if verdict.counter:
            self.stats[verdict.counter] += 1
        if verdict.action is Action.ELSEWHERE:
            ep.mark_down(self.section.endpoint_cooldown_s)
        if verdict.abandon:
            self._abandon(ep, key)

    def _abandon(self, ep: Endpoint, key: str) -> None:
        """A request whose dump may still arrive later: delete it when seen (and at close)."""
        self._abandoned.append((ep, key))
        delete_staged(ep.staging_dir, key)

    async def _await_dump(self, ep: Endpoint, key: str, sample: TokenizedSample, explain=None) -> CaptureResult | Refusal:
        expected = self._expected()
        return await await_dump(ep.staging_dir, key, sample, expected, self.section.dump_timeout_s, explain=explain, grace_s=GRACE_S)

    def _hook_report(self, ep: Endpoint, *, fresh: bool = False) -> HookReport:
        """The hooks' status of ``ep`` (read at most every 0.1 s for the "before" of each request: an older
        reading only makes "no prefill pass since" harder to conclude, never wrongly)."""
        now = time.monotonic()
        cached = self._reports.get(ep.url)
        if fresh or cached is None or now - cached[0] > 0.1:
            cached = (now, read_report(ep.staging_dir))
            self._reports[ep.url] = cached
        return cached[1]

    # ------------------------------------------------------------------ CaptureBackend API

    def info(self) -> CaptureInfo:
        if self._info is not None:
            return self._info
        self.validate()
        cfg = self._local_model_config()
        weight, eps = None, None
        fingerprint = ""
        if (Path(self.model_path) / "config.json").is_file():
            fingerprint = model_fingerprint(self.model_path)
            try:
                weight, eps = read_final_norm(self.model_path)
            except (KeyError, OSError) as exc:
                logger.warning("cannot read the final norm weight from %s: %s", self.model_path, exc)
                eps = cfg.get("rms_norm_eps")
        ep = self.endpoints[0]
        self._info = CaptureInfo(
            model_path=self.model_path,
            model_fingerprint=fingerprint,
            model_revision=self.model_revision,
            aux_layer_ids=list(self.aux_layer_ids),
            hidden_size=int(self._hidden_size or cfg.get("hidden_size") or 0),
            num_hidden_layers=int(cfg.get("num_hidden_layers") or 0),
            vocab_size=int(cfg["vocab_size"]) if cfg.get("vocab_size") else None,
            dtype=self.dtype or torch.bfloat16,
            final_state="pre_norm",
            final_norm_eps=float(eps) if eps is not None else None,
            final_norm_weight=weight,
            backend="sglang",
            backend_details={
                "servers": [e.url for e in self.endpoints],
                "sglang_version": ep.version,
                "mechanism": server_mechanism(ep),
                "run_id": self.run_id,
                "max_new_tokens": self.section.max_new_tokens,
            },
            verification=self._verification(ep),
        )
        return self._info

    @staticmethod
    def _verification(ep: Endpoint) -> dict:
        """Whether a test of this repository ran this server's SGLang release, mechanism and device (``sglang.support``)."""
        device = str(ep.server_info.get("device") or "cuda")
        verified, words = verification(str(ep.version), str(server_mechanism(ep)), device)
        return {"verified": verified, "by": words, "sglang_version": ep.version, "mechanism": server_mechanism(ep), "device": device}

    def capture_batch(self, samples: Sequence[TokenizedSample]) -> list[CaptureResult]:
        if not samples:
            return []
        self.validate()
        loop = self._ensure_loop()

        async def run_all():
            sem = asyncio.Semaphore(self.concurrency)

            async def one(s):
                async with sem:
                    return await self._capture_one(s)

            return await asyncio.gather(*(one(s) for s in samples))

        return list(loop.run(run_all()))

    def in_flight(self, batch_size: int) -> int:
        return max(int(batch_size), self.concurrency)

    def generator(self, regenerate: RegenerateSection, tokenizer: Any) -> Generator:
        """An SGLang generation client on these servers, in flight as many requests as their memory holds (``capacity.in_flight``)."""
        section = self.section
        sized = in_flight([e.server_info for e in self.endpoints], regenerate.max_new_tokens, regenerate.concurrency)
        info = self.info()
        self.one_pass = self._choose_one_pass(regenerate.capture)
        return SGLangGenerator(
            [e.url for e in self.endpoints],
            concurrency=sized.requests,
            in_flight_source=sized.source,
            model_fingerprint=info.model_fingerprint,
            vocab_size=info.vocab_size,
            request_timeout_s=regenerate.generation_timeout_s(section.request_timeout_s),
            retries=section.retries,
            backoff_s=section.backoff_s,
            cooldown_s=section.endpoint_cooldown_s,
            max_response_bytes=section.max_response_bytes,
            one_pass_run=self.run_id if self.one_pass else None,
            run_seq=self._seq,
        )

    def _choose_one_pass(self, capture: str) -> bool:
        """Whether regenerated conversations are captured while generated (``regenerate.capture``); says why not, once."""
        if capture == "prefill":
            return False
        blockers = [b for ep in self.endpoints if (b := one_pass_blocker(ep)) is not None]
        if not blockers:
            logger.info("regeneration captures each conversation's states while generating it (one pass)")
            return True
        if capture == "one_pass":
            raise ServerValidationError("regenerate.capture is one_pass, but " + "; ".join(blockers))
        logger.warning("one-pass capture is off, every regenerated conversation is prefilled again for capture: %s", "; ".join(blockers))
        return False

    def capture_burst(self, batch_size: int) -> tuple[int, int] | None:
        """One prefill batch of the servers (``capacity.prefill_tokens``), or as many samples as capture keeps in flight."""
        return prefill_tokens([e.server_info for e in self.endpoints]), self.in_flight(batch_size)

    def capture_stream(self, samples: Iterable[TokenizedSample], batch_size: int) -> Iterator[CaptureResult]:
        """Keep ``max(batch_size, concurrency)`` requests in flight; yield results as they complete."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.validate()
        loop = self._ensure_loop()
        limit = self.in_flight(batch_size)
        pending: set[concurrent.futures.Future] = set()
        it = iter(samples)
        exhausted = False
        try:
            while True:
                while not exhausted and len(pending) < limit:
                    try:
                        sample = next(it)
                    except StopIteration:
                        exhausted = True
                        break
                    pending.add(loop.submit(self._capture_one(sample)))
                if not pending:
                    return
                done, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for fut in done:
                    yield fut.result()
        finally:
            for fut in pending:
                fut.cancel()

    def close(self) -> None:
        if self._loop is None:
            return
        self._loop.cancel_pending()  # requests still in flight (a stopped build) unwind before the session goes
        for ep, key in self._abandoned:
            delete_staged(ep.staging_dir, key)
        self._abandoned.clear()
        if self.one_pass:
            for ep in self.endpoints:  # pieces that came after their conversation was assembled, or of failed attempts
                _clear_run(ep.staging_dir, self.run_id)
        prune_mappings()  # the mappings of dumps and spares deleted since: their memory goes back now
        if self._session is not None:
            try:
                self._loop.run(self._session.close(), timeout=10)
            except Exception:
                pass
            self._session = None
        self._loop.stop()
        self._loop = None


def _clear(sources: Sequence[Source]) -> None:
    """Hand back the pieces (and drop the refusal markers) of a conversation's requests left after its assembly."""
    for source in sources:
        for path in source.new_pieces():
            hand_back_dump(path)
        delete_staged(source.staging_dir, source.rid)


def _clear_run(staging_dir: str | None, run_id: str) -> None:
    """Hand back every piece and refusal marker of this run's one-pass requests still in ``staging_dir``."""
    if not staging_dir:
        return
    head = f"hs-{run_id}-"
    try:
        names = os.listdir(staging_dir)
    except OSError:
        return
    for name in names:
        stem = name.split(".", 1)[0]
        if name.startswith(head) and is_one_pass(stem) and (name.endswith((DUMP_SUFFIX, REFUSED_SUFFIX))):
            hand_back_dump(os.path.join(staging_dir, name))

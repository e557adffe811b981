"""The SGLang capture client: samples -> ``/generate`` requests -> per-request dump files.

The server side (``hs-dataset serve``, :mod:`hs_dataset.sglang.server`) writes one
``{rid}.safetensors`` per prefilled request into a private staging directory on the
same host; this client sends each sample's ``input_ids`` with a unique request id,
waits for that dump, checks it (token ids, shapes, dtype, layers), turns it into a
:class:`~hs_dataset.sample.CapturedSample` and deletes it. Anything else -- a refusal
marker, a missing or late dump, mismatched tokens, a server error after the
retries -- becomes a :class:`~hs_dataset.capture.base.CaptureFailure`, never a
partial sample. See docs/SGLANG.md.

Before any work, :meth:`SGLangBackend.validate` checks every server: reachable,
supported SGLang version, serving the same model, hs_dataset's hooks installed with
the same aux layers, a private staging directory, the radix-cache policy, and a probe
request whose dump must appear. Problems raise
:class:`~hs_dataset.errors.ServerValidationError` naming the fix.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import torch

from hs_dataset.capture.base import CaptureBackend, CaptureFailure, CaptureInfo, CaptureResult
from hs_dataset.model.snapshot import load_text_config
from hs_dataset.sglang.client.http import LoopThread, new_session
from hs_dataset.config import Card, SGLangBackendSection
from hs_dataset.dtypes import state_dtype
from hs_dataset.errors import ServerValidationError
from hs_dataset.formats.encoding import all_finite
from hs_dataset.host_buffers import HostBufferPool
from hs_dataset.sample import CapturedSample, TokenizedSample
from hs_dataset.wire.dump import DUMP_FORMAT, DUMP_SUFFIX, DUMP_VERSION, REFUSED_SUFFIX, RETRYABLE_REFUSALS
from hs_dataset.wire.fp8 import FP8_ENCODING, SCALE_SUFFIX, STATE_ENCODING_KEY
from hs_dataset.wire.mapped_files import FileMaps, copy_out
from hs_dataset.wire.rid import make_rid
from hs_dataset.wire.spares import hand_back_dump

__all__ = ["SGLangBackend", "Endpoint"]

logger = logging.getLogger("hs_dataset.sglang.client.backend")

HOOKS_MODULE = "hs_dataset.sglang.server.hooks"

class _DumpLost(Exception):
    pass


@dataclass
class Endpoint:
    """One server: its URL, its staging directory and its health."""

    url: str
    staging_dir: str | None = None
    version: str | None = None
    uses_rids: bool = True
    server_info: dict = field(default_factory=dict)
    inflight: int = 0
    failures: int = 0
    down_until: float = 0.0
    served: int = 0

    def available(self, now: float) -> bool:
        return now >= self.down_until


_READ_BUFFERS = HostBufferPool()  # one per process: every backend's dump reads reuse it
_DUMP_MAPS = FileMaps(writable=False)  # one per process: the dump files going round the spare pool, each mapped once


def _read_dump(path: str) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """Read a dump without following symlinks; returns (metadata, tensors).

    The header goes through the one safetensors header parser (bounds, offsets, known
    dtypes, sizes, tensors tiling the data exactly); the data is then copied once (no
    GIL held) into one buffer whose slices are the tensors: through the mapping kept of
    the file from its earlier rounds (``mapped_files``: a third of ``readinto``'s cost
    on tmpfs), or with ``readinto`` the first time a file is seen (it is mapped then,
    for its next round) and where no mapping can be made. Reading into a bytes object
    and decoding it with safetensors made two more copies under the GIL: the client
    read dumps at a third of the disk's rate. The buffer is leased from a pool of memory
    already touched (``host_buffers``), and comes back when the sample's tensors are gone.
    """
    from hs_dataset.formats.encoding import SAFETENSORS_DTYPES
    from hs_dataset.formats.safetensors_layout import DTYPE_SIZES, read_header

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb", buffering=0) as f:
        specs, metadata, start = read_header(f, path)
        st = os.fstat(fd)
        data = _READ_BUFFERS.lease(st.st_size - start)
        view = memoryview(data.numpy())
        with _DUMP_MAPS.mapped(fd, st.st_size, kept_only=True, file_stat=st) as address:
            if address is not None:
                copy_out(address, start, view)
            else:
                got = 0
                while got < len(view):
                    n = f.readinto(view[got:])
                    if not n:
                        raise OSError(f"{path}: file shrank while being read")
                    got += n
    tensors = {}
    for name, spec in specs.items():
        dtype = SAFETENSORS_DTYPES.get(spec.dtype)
        if dtype is None:
            raise ValueError(f"tensor {name!r} has dtype {spec.dtype}, which no dump holds")
        raw = data[spec.begin : spec.end]
        if spec.begin % DTYPE_SIZES[spec.dtype]:  # not from our server (it aligns every tensor): copy to align
            raw = raw.clone()
        tensors[name] = raw.view(dtype).view(spec.shape)
    return metadata, tensors


def _content_key(ids: torch.Tensor) -> str:
    from hs_dataset.wire.rid import content_key

    return content_key(ids)


class SGLangBackend(CaptureBackend):
    """Capture through one or more hs_dataset-enabled SGLang servers (see the module docstring).

    Args:
        servers: server URLs (``http://host:port``); load is spread over them, and a
            failing one is taken out of rotation for a while (its samples go to others).
        model_path: local snapshot of the served model (for :meth:`info`: fingerprint,
            final-norm weight and eps; and to check the server serves the same model).
        aux_layer_ids: HF ``hidden_states`` indexes; must equal the server's.
        dtype: expected dump dtype (``"bfloat16"`` ...); checked at the probe.
        staging_dir: where dumps appear; default: what the server reports in its hook config.
        concurrency: requests in flight (all servers together).
        request_timeout_s / dump_timeout_s: HTTP request and dump-arrival timeouts.
        retries: extra attempts per sample for retryable failures (server errors,
            timeouts, "staging full"), with exponential back-off from ``backoff_s``.
        max_new_tokens: 1 (default, safest) or 0 (prefill only; not with spec decoding).
        allow_radix_cache: accept a server with its prefix cache on (prompts that hit it
            are refused by the server and reported as failures).
        force_full_prefill: send ``return_logprob`` with ``logprob_start_len=0`` so SGLang
            recomputes every prompt token even with the prefix cache on (costs logits
            for every prompt token).
    """

    def __init__(
        self,
        servers: Sequence[str] | str,
        *,
        model_path: str | os.PathLike,
        aux_layer_ids: Sequence[int],
        dtype: str | torch.dtype | None = None,
        staging_dir: str | None = None,
        concurrency: int = 8,
        request_timeout_s: float = 120.0,
        dump_timeout_s: float = 60.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        max_new_tokens: int = 1,
        allow_radix_cache: bool = False,
        force_full_prefill: bool = False,
        probe: bool = True,
        endpoint_cooldown_s: float = 5.0,
        run_id: str | None = None,
        model_revision: str | None = None,
        text_module: str | None = None,
    ) -> None:
        if isinstance(servers, str):
            servers = [servers]
        servers = [s.rstrip("/") for s in servers if s]
        if not servers:
            raise ValueError("SGLangBackend needs at least one server URL (backend.urls in the card, or --server URL)")
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if max_new_tokens not in (0, 1):
            raise ValueError("max_new_tokens must be 0 or 1 (only the prefill is captured)")
        self.endpoints = [Endpoint(url=u, staging_dir=staging_dir) for u in servers]
        self.model_path = str(model_path)
        self.aux_layer_ids = [int(i) for i in aux_layer_ids]
        if isinstance(dtype, str):
            dtype = state_dtype(dtype)
        self.dtype: torch.dtype | None = dtype
        self.concurrency = int(concurrency)
        self.request_timeout_s = float(request_timeout_s)
        self.dump_timeout_s = float(dump_timeout_s)
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)
        self.max_new_tokens = int(max_new_tokens)
        self.allow_radix_cache = bool(allow_radix_cache)
        self.force_full_prefill = bool(force_full_prefill)
        self.probe = bool(probe)
        self.endpoint_cooldown_s = float(endpoint_cooldown_s)
        self.run_id = run_id or secrets.token_hex(6)
        self.model_revision = model_revision
        self.text_module = text_module
        self._seq = itertools.count(1)
        self._validated = False
        self._hidden_size: int | None = None
        self._info: CaptureInfo | None = None
        self._loop: LoopThread | None = None
        self._session = None
        self._rr = itertools.count()
        self._abandoned: list[tuple[Endpoint, str]] = []
        self.stats = {"requests": 0, "retries": 0, "refused": 0, "timeouts": 0, "endpoint_errors": 0}

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_card(
        cls,
        card: Card,
        *,
        model_path: str | None = None,
        servers: Sequence[str] | None = None,
        **overrides: Any,
    ) -> "SGLangBackend":
        """Build from a card's ``backend`` section (see docs/CARDS.md); the URL defaults to ``sglang.host``/``sglang.port``."""
        from hs_dataset.model.snapshot import resolve_model_path

        backend, sg = card.backend, card.sglang
        if not isinstance(backend, SGLangBackendSection):
            raise ValueError(f"config {card.name!r} uses backend {backend.name!r}; SGLangBackend needs `backend: {{name: sglang}}`")
        urls = list(servers or backend.urls) or [f"http://{sg.host}:{sg.port}"]
        path = model_path or card.model.path or os.environ.get("HS_DATASET_MODEL_PATH")
        if not path:
            raise ValueError(f"config {card.name!r} needs a local model directory (--model-path)")
        staging_dir = backend.staging_dir or (sg.staging.dir if len(urls) == 1 else None)
        kwargs: dict[str, Any] = {
            "model_path": str(resolve_model_path(str(path))),
            "aux_layer_ids": list(card.layers.aux),
            "dtype": card.dtype,
            "model_revision": card.model.revision,
            "text_module": card.model.text_module,
            "concurrency": backend.concurrency,
            "request_timeout_s": backend.request_timeout_s,
            "dump_timeout_s": backend.dump_timeout_s,
            "retries": backend.retries,
            "backoff_s": backend.backoff_s,
            "max_new_tokens": backend.max_new_tokens,
            "allow_radix_cache": backend.allow_radix_cache,
            "force_full_prefill": backend.force_full_prefill,
            "staging_dir": staging_dir,
            "endpoint_cooldown_s": backend.endpoint_cooldown_s,
        }
        if "batch_size" in overrides:  # the pipeline's --batch-size means requests in flight here
            bs = overrides.pop("batch_size")
            if bs:
                kwargs["concurrency"] = int(bs)
        kwargs.update({k: v for k, v in overrides.items() if v is not None})
        return cls(urls, **kwargs)

    # ------------------------------------------------------------------ plumbing

    def _ensure_loop(self) -> LoopThread:
        if self._loop is None:
            self._loop = LoopThread()
        return self._loop

    async def _get_session(self):
        if self._session is None or self._session.closed:
            self._session = new_session(self.concurrency, self.request_timeout_s)
        return self._session

    async def _get_json(self, ep: Endpoint, path: str, timeout: float = 10.0):
        import aiohttp

        session = await self._get_session()
        async with session.get(ep.url + path, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise _HTTPStatus(resp.status, text)
            return json.loads(text) if text.strip() else None

    async def _post_generate(self, ep: Endpoint, rid: str, ids: list[int]) -> dict:
        import aiohttp

        body: dict[str, Any] = {
            "rid": rid,
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": self.max_new_tokens, "temperature": 0.0},
        }
        if self.force_full_prefill:
            body["return_logprob"] = True
            body["logprob_start_len"] = 0
        session = await self._get_session()
        async with session.post(ep.url + "/generate", json=body, timeout=aiohttp.ClientTimeout(total=self.request_timeout_s)) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise _HTTPStatus(resp.status, text)
            return json.loads(text)

    # ------------------------------------------------------------------ validation

    def validate(self) -> None:
        """Check every server (see the module docstring); raises :class:`ServerValidationError`."""
        if self._validated:
            return
        loop = self._ensure_loop()
        problems = []
        for ep in self.endpoints:
            try:
                loop.run(self._validate_endpoint(ep), timeout=self.request_timeout_s + self.dump_timeout_s + 60)
            except ServerValidationError as exc:
                problems.append(str(exc))
        if problems:
            raise ServerValidationError("\n".join(problems))
        self._validated = True

    def _local_model_config(self) -> dict:
        if not (Path(self.model_path) / "config.json").is_file():
            return {}
        return load_text_config(self.model_path)

    async def _validate_endpoint(self, ep: Endpoint) -> None:
        import aiohttp

        from hs_dataset.sglang.support import UnsupportedVersionError, parse_version, support_for
        from hs_dataset.wire.private_dir import StagingError, check_private_dir

        url = ep.url
        fix = "start it with `hs-dataset serve --config <card>`"
        try:
            session = await self._get_session()
            async with session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=10)) as resp:
                if resp.status != 200:
                    raise ServerValidationError(f"SGLang server {url} is not healthy (/health answered {resp.status}); wait for it to finish starting or check its log")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise ServerValidationError(f"SGLang server {url} is unreachable ({type(exc).__name__}: {exc}); {fix}, or fix the server URL") from None
        info = None
        for path in ("/server_info", "/get_server_info"):
            try:
                info = await self._get_json(ep, path)
                break
            except _HTTPStatus:
                continue
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                raise ServerValidationError(f"SGLang server {url}: cannot read {path} ({exc})") from None
        if not isinstance(info, dict):
            raise ServerValidationError(f"SGLang server {url} answers no /server_info: is this an SGLang server?")
        ep.server_info = info
        version = str(info.get("version") or "")
        try:
            support_for(version)
        except (UnsupportedVersionError, ValueError) as exc:
            raise ServerValidationError(f"SGLang server {url}: {exc}") from None
        ep.version = version
        ep.uses_rids = parse_version(version) >= (0, 5, 15)

        served = str(info.get("model_path") or "")
        if not self._same_model(served):
            raise ServerValidationError(
                f"SGLang server {url} serves {served!r}, but this config captures {self.model_path!r}: "
                "start the server with the card's model (hs-dataset serve --config <card>) or point the builder at the right server"
            )

        specs = info.get("forward_hooks") or []
        if isinstance(specs, str):
            specs = json.loads(specs)
        ours = [s for s in specs if str(s.get("hook_factory", "")).startswith(HOOKS_MODULE + ":model_hook")]
        if not ours:
            raise ServerValidationError(
                f"capture is not enabled on SGLang server {url}: it runs without hs_dataset's forward hooks "
                f"(--forward-hooks with {HOOKS_MODULE}:model_hook); restart it with `hs-dataset serve --config <card>`"
            )
        if not any(str(s.get("hook_factory", "")).startswith(HOOKS_MODULE + ":norm_hook") for s in specs):
            raise ServerValidationError(f"SGLang server {url} has no hs_dataset final-norm hook, so no pre-norm final state; restart it with `hs-dataset serve`")
        config = dict(ours[0].get("config") or {})
        server_ids = [int(i) for i in config.get("hf_aux_layer_ids") or []]
        if server_ids != self.aux_layer_ids:
            raise ServerValidationError(
                f"SGLang server {url} captures HF hidden_states {server_ids}, this config wants {self.aux_layer_ids}: "
                "restart the server with this card"
            )
        if config.get("mechanism", "aux_return") == "aux_return" and not info.get("enable_return_aux_hidden_states", False):
            raise ServerValidationError(
                f"SGLang server {url} has hs_dataset's hooks but not --enable-return-aux-hidden-states; restart it with `hs-dataset serve`"
            )
        rid_prefix = str(config.get("rid_prefix", "hs-"))
        if not f"hs-{self.run_id}-".startswith(rid_prefix):
            raise ServerValidationError(f"SGLang server {url} only captures request ids starting with {rid_prefix!r}; use run_id accordingly")
        staging = ep.staging_dir or config.get("staging_dir")
        if not staging:
            raise ServerValidationError(f"SGLang server {url}: its hook config names no staging_dir")
        try:
            check_private_dir(staging)
        except StagingError as exc:
            raise ServerValidationError(
                f"SGLang server {url}: unusable staging directory: {exc} (the builder must run on the server's host, as the same user)"
            ) from None
        ep.staging_dir = staging

        if not info.get("disable_radix_cache", False) and not (self.allow_radix_cache or self.force_full_prefill):
            raise ServerValidationError(
                f"SGLang server {url} has its radix (prefix) cache on: prompts sharing a prefix would only be partly "
                "computed and are refused. Restart it with --disable-radix-cache (hs-dataset serve does), or set "
                "backend.force_full_prefill (recompute every prompt) or backend.allow_radix_cache (accept refusals)"
            )
        if info.get("speculative_algorithm") and self.max_new_tokens == 0:
            raise ServerValidationError(f"SGLang server {url} runs speculative decoding: max_new_tokens 0 is not allowed there; use 1")

        if self.probe:
            await self._probe(ep)

    def _same_model(self, served: str) -> bool:
        mine = self.model_path
        if os.path.isdir(served) and os.path.isdir(mine):
            try:
                return os.path.samefile(served, mine) or _config_bytes(served) == _config_bytes(mine)
            except OSError:
                return False
        return served.rstrip("/") == mine.rstrip("/") or os.path.basename(served.rstrip("/")) == os.path.basename(mine.rstrip("/"))

    async def _probe(self, ep: Endpoint) -> None:
        cfg = self._local_model_config()
        vocab = int(cfg.get("vocab_size") or 1000)
        ids = torch.tensor([(97 + 31 * i) % max(vocab - 1, 2) + 1 for i in range(7)], dtype=torch.int64)
        sample = TokenizedSample("__hs_probe__", ids, torch.ones_like(ids, dtype=torch.bool))
        result = await self._capture_one(sample, probing=True, endpoints=[ep])
        if isinstance(result, CaptureFailure):
            raise ServerValidationError(
                f"SGLang server {ep.url}: the probe request produced no usable dump ({result.reason}); "
                f"check the server log for 'hs_dataset capture' lines"
            )
        h = result.final_hidden_state.shape[1]
        want_h = cfg.get("hidden_size")
        if want_h and int(want_h) != h:
            raise ServerValidationError(f"SGLang server {ep.url}: dumps have hidden size {h}, the local model has {want_h}: wrong model")
        produced = torch.bfloat16 if result.aux_scale is not None else result.aux_hidden_states.dtype  # fp8 decodes to bf16
        if self.dtype is not None and produced != self.dtype:
            raise ServerValidationError(
                f"SGLang server {ep.url} produces {produced} states, this config wants {self.dtype}: "
                "restart the server with the card's dtype (--dtype)"
            )
        self._hidden_size = h
        if self.dtype is None:
            self.dtype = produced

    # ------------------------------------------------------------------ one sample

    def _pick(self, endpoints: Sequence[Endpoint], avoid: set[str]) -> Endpoint | None:
        now = time.monotonic()
        ready = [e for e in endpoints if e.available(now) and e.url not in avoid] or [e for e in endpoints if e.available(now)]
        if not ready:
            return None
        start = next(self._rr)
        ordered = ready[start % len(ready) :] + ready[: start % len(ready)]
        return min(ordered, key=lambda e: e.inflight)

    def _mark_down(self, ep: Endpoint) -> None:
        ep.failures += 1
        ep.down_until = time.monotonic() + min(60.0, self.endpoint_cooldown_s * (2 ** min(ep.failures - 1, 4)))
        self.stats["endpoint_errors"] += 1

    async def _capture_one(self, sample: TokenizedSample, *, probing: bool = False, endpoints: Sequence[Endpoint] | None = None) -> CaptureResult:
        import aiohttp

        endpoints = list(endpoints or self.endpoints)
        ids = sample.input_ids
        if ids.numel() == 0:
            return CaptureFailure(sample.sample_id, "empty prompt")
        ids_list = ids.tolist()
        attempts = self.retries + len(endpoints)
        last_reason = "not attempted"
        avoid: set[str] = set()
        retries_used = 0
        for attempt in range(attempts):
            if attempt:
                self.stats["retries"] += 1
                await asyncio.sleep(min(30.0, self.backoff_s * (2 ** (attempt - 1))))
            ep = self._pick(endpoints, avoid)
            if ep is None:
                wait = min(e.down_until for e in endpoints) - time.monotonic()
                await asyncio.sleep(max(0.0, min(wait, 30.0)))
                ep = self._pick(endpoints, set())
                if ep is None:
                    last_reason = "every SGLang server is unreachable"
                    continue
            rid = make_rid(self.run_id, next(self._seq), len(ids_list))
            key = rid if ep.uses_rids else _content_key(ids)
            ep.inflight += 1
            self.stats["requests"] += 1
            try:
                try:
                    await self._post_generate(ep, rid, ids_list)
                except _HTTPStatus as exc:
                    if exc.status >= 500 or exc.status == 429:
                        self._mark_down(ep)
                        avoid.add(ep.url)
                        last_reason = f"{ep.url} answered HTTP {exc.status}: {exc.text[:200]}"
                        self._abandon(ep, key)
                        continue
                    self._abandon(ep, key)
                    return CaptureFailure(sample.sample_id, f"{ep.url} rejected the request (HTTP {exc.status}): {exc.text[:300]}")
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                    self._mark_down(ep)
                    avoid.add(ep.url)
                    last_reason = f"{ep.url}: {type(exc).__name__}: {exc}"
                    self._abandon(ep, key)
                    continue
                ep.failures = 0
                try:
                    result = await self._await_dump(ep, key, sample)
                except _DumpLost as exc:
                    self.stats["timeouts"] += 1
                    last_reason = str(exc)
                    self._abandon(ep, key)
                    retries_used += 1
                    if retries_used > self.retries:
                        break
                    continue
                if isinstance(result, _Refusal):
                    self.stats["refused"] += 1
                    last_reason = f"server refused {key}: {result.reason}"
                    if result.reason.startswith(RETRYABLE_REFUSALS):
                        retries_used += 1
                        if retries_used > self.retries:
                            break
                        continue
                    return CaptureFailure(sample.sample_id, last_reason)
                ep.served += 1
                return result
            finally:
                ep.inflight -= 1
        return CaptureFailure(sample.sample_id, last_reason)

    def _abandon(self, ep: Endpoint, key: str) -> None:
        """A request whose dump may still arrive later: delete it when seen (and at close)."""
        self._abandoned.append((ep, key))
        _delete_staged(ep, key)

    async def _await_dump(self, ep: Endpoint, key: str, sample: TokenizedSample):
        dump = os.path.join(ep.staging_dir, key + DUMP_SUFFIX)
        refused = os.path.join(ep.staging_dir, key + REFUSED_SUFFIX)
        deadline = time.monotonic() + self.dump_timeout_s
        delay = 0.002
        while True:
            if os.path.exists(dump):
                loop = asyncio.get_running_loop()
                try:
                    return await loop.run_in_executor(None, self._load_and_check, dump, refused, key, sample)
                finally:
                    hand_back_dump(dump)  # read into our memory: the server may write the next dump over it
                    try:
                        os.unlink(refused)
                    except FileNotFoundError:
                        pass
            if os.path.exists(refused):
                try:
                    with open(refused, "rb") as f:
                        reason = str(json.loads(f.read()).get("reason", "no reason given"))
                except (OSError, ValueError) as exc:
                    reason = f"unreadable refusal marker ({exc})"
                try:
                    os.unlink(refused)
                except FileNotFoundError:
                    pass
                return _Refusal(reason)
            if time.monotonic() > deadline:
                raise _DumpLost(
                    f"no dump for {key} in {ep.staging_dir} within {self.dump_timeout_s:.0f} s after the server answered "
                    "(server-side capture failed or is too slow: see its log)"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.05)

    def _load_and_check(self, path: str, refused: str, key: str, sample: TokenizedSample) -> CaptureResult:
        try:
            meta, tensors = _read_dump(path)
        except Exception as exc:
            return CaptureFailure(sample.sample_id, f"unreadable dump {key}: {type(exc).__name__}: {exc}")
        sid = sample.sample_id
        if meta.get("format") != DUMP_FORMAT or meta.get("version") != DUMP_VERSION:
            return CaptureFailure(sid, f"dump {key} has format {meta.get('format')!r} v{meta.get('version')!r}, expected {DUMP_FORMAT} v{DUMP_VERSION}: update hs_dataset on the server")
        if meta.get("rid") != key:
            return CaptureFailure(sid, f"dump {key} names request {meta.get('rid')!r}")
        if meta.get("final_state") != "pre_norm":
            return CaptureFailure(sid, f"dump {key} holds a {meta.get('final_state')!r} final state, expected pre_norm")
        try:
            ids_meta = json.loads(meta.get("hf_aux_layer_ids", "null"))
        except ValueError:
            ids_meta = None
        if ids_meta != self.aux_layer_ids:
            return CaptureFailure(sid, f"dump {key} holds HF layers {ids_meta}, expected {self.aux_layer_ids}")
        ids = tensors.get("input_ids")
        aux = tensors.get("aux_hidden_states")
        final = tensors.get("final_hidden_state")
        if ids is None or aux is None or final is None:
            return CaptureFailure(sid, f"dump {key} lacks tensors (has {sorted(tensors)})")
        t = sample.num_tokens
        if ids.dtype != torch.int64 or ids.shape != (t,) or not torch.equal(ids, sample.input_ids):
            return CaptureFailure(sid, f"dump {key}: token ids differ from the ones sent ({tuple(ids.shape)} vs {t} tokens)")
        k = len(self.aux_layer_ids)
        if aux.dim() != 3 or aux.shape[0] != t or aux.shape[1] != k:
            return CaptureFailure(sid, f"dump {key}: aux_hidden_states shape {tuple(aux.shape)}, expected [{t}, {k}, H]")
        h = aux.shape[2]
        if final.shape != (t, h):
            return CaptureFailure(sid, f"dump {key}: final_hidden_state shape {tuple(final.shape)}, expected [{t}, {h}]")
        if self._hidden_size is not None and h != self._hidden_size:
            return CaptureFailure(sid, f"dump {key}: hidden size {h}, expected {self._hidden_size}")
        encoding = meta.get(STATE_ENCODING_KEY, "native")
        aux_scale = final_scale = None
        if encoding == FP8_ENCODING:  # quantized on the server's GPU: handed to the writer as stored
            aux_scale, final_scale = tensors.get("aux_hidden_states" + SCALE_SUFFIX), tensors.get("final_hidden_state" + SCALE_SUFFIX)
            if aux.dtype != torch.float8_e4m3fn or final.dtype != torch.float8_e4m3fn or aux_scale is None or final_scale is None:
                return CaptureFailure(sid, f"dump {key}: {FP8_ENCODING} needs float8_e4m3fn states and both scale tensors (has {sorted(tensors)})")
            if aux_scale.dtype != torch.float32 or aux_scale.shape != (t, k) or final_scale.dtype != torch.float32 or final_scale.shape != (t,):
                return CaptureFailure(sid, f"dump {key}: fp8 scales {tuple(aux_scale.shape)}/{tuple(final_scale.shape)}, expected float32 [{t}, {k}] and [{t}]")
            if self.dtype is not None and meta.get("dtype") != str(self.dtype).replace("torch.", ""):
                return CaptureFailure(sid, f"dump {key}: states of a {meta.get('dtype')} model, expected {self.dtype}")
        elif encoding != "native":
            return CaptureFailure(sid, f"dump {key}: unknown state encoding {encoding!r}: update hs_dataset on the client")
        elif self.dtype is not None and (aux.dtype != self.dtype or final.dtype != self.dtype):
            return CaptureFailure(sid, f"dump {key}: dtype {aux.dtype}/{final.dtype}, expected {self.dtype}")
        # Checked here, on this loader thread while the bytes are in cache; all_finite remembers the
        # answer, so the writer's one adding thread does not scan them again (a NaN is still its to report).
        all_finite(aux) and all_finite(final)
        return CapturedSample(
            sample_id=sid,
            input_ids=sample.input_ids,
            loss_mask=sample.loss_mask,
            aux_hidden_states=aux,
            final_hidden_state=final,
            aux_scale=aux_scale,
            final_scale=final_scale,
        )

    # ------------------------------------------------------------------ CaptureBackend API

    def info(self) -> CaptureInfo:
        if self._info is not None:
            return self._info
        from hs_dataset.model.snapshot import model_fingerprint, read_final_norm

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
                "mechanism": self._server_mechanism(ep),
                "run_id": self.run_id,
                "max_new_tokens": self.max_new_tokens,
            },
        )
        return self._info

    @staticmethod
    def _server_mechanism(ep: Endpoint) -> str | None:
        for s in ep.server_info.get("forward_hooks") or []:
            if str(s.get("hook_factory", "")).startswith(HOOKS_MODULE + ":model_hook"):
                return (s.get("config") or {}).get("mechanism", "aux_return")
        return None

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

    def capture_stream(self, samples: Iterable[TokenizedSample], batch_size: int) -> Iterator[CaptureResult]:
        """Keep ``max(batch_size, concurrency)`` requests in flight; yield results as they complete."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.validate()
        loop = self._ensure_loop()
        limit = max(int(batch_size), self.concurrency)
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
        for ep, key in self._abandoned:
            _delete_staged(ep, key)
        self._abandoned.clear()
        _DUMP_MAPS.prune()  # the mappings of dumps and spares deleted since: their memory goes back now
        if self._session is not None:
            try:
                self._loop.run(self._session.close(), timeout=10)
            except Exception:
                pass
            self._session = None
        self._loop.stop()
        self._loop = None


@dataclass
class _Refusal:
    reason: str


class _HTTPStatus(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text[:200]}")
        self.status = status
        self.text = text


def _config_bytes(directory: str) -> bytes | None:
    try:
        return (Path(directory) / "config.json").read_bytes()
    except OSError:
        return None


def _delete_staged(ep: Endpoint, key: str) -> None:
    """Remove a request's dump and refusal marker from the endpoint's staging dir, if present."""
    if not ep.staging_dir:
        return
    for suffix in (DUMP_SUFFIX, REFUSED_SUFFIX):
        try:
            os.unlink(os.path.join(ep.staging_dir, key + suffix))
        except FileNotFoundError:
            pass

"""The capture core: per-request dumps from prefill forward passes.

Runs inside SGLang scheduler processes; imports only stdlib and torch (and its
siblings in this package). The SGLang-facing glue lives in
:mod:`hs_dataset.sglang.server.hooks` (0.5.9+) and
:mod:`hs_dataset.sglang.legacy.hook` (<= 0.5.5, called by the AST patch); both
reduce a forward pass to a :class:`BatchView` plus tensors and call
:meth:`CaptureCore.process`.

What :meth:`CaptureCore.process` does, on the forward thread:

1. ignores every pass that is not exactly ``EXTEND`` (decode, mixed, target-verify,
   idle, ...);
2. splits the batch per request by ``extend_seq_lens``; ignores requests whose rid
   lacks our prefix (warm-up, health checks, other clients) and logs rids that have
   the prefix but fail the strict :data:`~hs_dataset.wire.rid.RID_RE`
   check (never used in a file name);
3. a request seen whole (prefix length 0, all ``T`` tokens of its rid) is stored; a
   chunked prefill (prefix length == tokens assembled so far) is assembled across
   passes and stored once complete; anything else -- a prefix-cache hit, a chunk out
   of order, more tokens than the rid says -- is refused with a marker;
4. reserves room in the bounded staging budget (waiting at most ``max_wait_s`` per
   forward pass in total), snapshots the rows to host memory (see :mod:`.copier`),
   and hands them to background writer threads that write
   ``{rid}.safetensors`` atomically. No room in time -> a refusal marker.

With ``storage: fp8`` the states of the whole pass are quantized on the device
(:func:`~hs_dataset.wire.fp8.quantize_fp8_per_token`, the dataset's own
``fp8_e4m3_per_token`` encoding) before the copy: half the PCIe, pinned and staging
bytes of bf16, and the client stores them as they are.

A dump is written as the safetensors header (:func:`~hs_dataset.wire.safetensors_header.dump_header`)
followed by the tensors' bytes straight from the pinned host buffers, in one
``os.writev``: no serialized copy of the file is built (``safetensors.torch.save``
made one, which halved the rate a writer thread reached).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from hs_dataset.dtypes import from_torch
from hs_dataset.libc import name_os_thread
from hs_dataset.sglang.server.copier import HostCopier, HostPiece, host_bytes
from hs_dataset.wire.dump import DUMP_FORMAT, DUMP_SUFFIX, DUMP_VERSION, REFUSED_NO_HOST_BUFFER, REFUSED_STAGING_FULL, REFUSED_WRITE_FAILED
from hs_dataset.wire.fp8 import FP8_ENCODING, SCALE_SUFFIX, STATE_ENCODING_KEY, quantize_fp8_per_token
from hs_dataset.wire.rid import CONTENT_KEY_PREFIX, content_key, RID_RE, rid_num_tokens
from hs_dataset.wire.safetensors_header import dump_header
from hs_dataset.sglang.server.staging import StagingBudget, StagingDir

__all__ = ["CaptureConfig", "BatchView", "CaptureCore", "content_key", "CONTENT_KEY_PREFIX", "ENV_PREFIX"]

logger = logging.getLogger("hs_dataset.sglang.server")

ENV_PREFIX = "HS_CAPTURE_"

_GiB = 1 << 30


def _env(environ: Mapping[str, str], key: str):
    return environ.get(ENV_PREFIX + key)


@dataclass(frozen=True)
class CaptureConfig:
    """How a server process captures; from the forward-hooks ``config`` and ``HS_CAPTURE_*`` env vars.

    Keys of the JSON config (env var in brackets, used when the key is absent):
    ``staging_dir`` [HS_CAPTURE_STAGING_DIR], ``hf_aux_layer_ids`` [HS_CAPTURE_LAYER_IDS,
    comma-separated], ``rid_prefix`` [HS_CAPTURE_RID_PREFIX], ``max_staging_bytes``
    [HS_CAPTURE_MAX_BYTES], ``max_staging_files`` [HS_CAPTURE_MAX_FILES], ``max_wait_s``
    [HS_CAPTURE_MAX_WAIT_S], ``writer_threads`` [HS_CAPTURE_WRITERS], ``pinned_pool_bytes``
    [HS_CAPTURE_PINNED_BYTES], ``orphan_ttl_s`` [HS_CAPTURE_ORPHAN_TTL_S], ``assembly_ttl_s``
    [HS_CAPTURE_ASSEMBLY_TTL_S], ``content_keys`` [HS_CAPTURE_CONTENT_KEYS], ``storage``
    [HS_CAPTURE_STORAGE: ``native`` or ``fp8``, quantized on the device]; plus
    ``mechanism``, ``module_path``, ``sglang_aux_layer_ids``, ``architectures``,
    ``num_hidden_layers`` (written by ``hs-dataset serve``).
    """

    staging_dir: str
    hf_aux_layer_ids: tuple[int, ...]
    rid_prefix: str = "hs-"
    mechanism: str = "aux_return"
    module_path: str = "model"
    sglang_aux_layer_ids: tuple[int, ...] | None = None
    architectures: tuple[str, ...] = ()
    num_hidden_layers: int | None = None
    max_staging_bytes: int = 16 * _GiB
    max_staging_files: int = 4096
    max_wait_s: float = 2.0
    # dumps go out with one writev from pinned memory; 4 threads carry a 26k tok/s Kimi-K2.5
    # prefill (1.5 GB/s) with room to spare, 8 reached 6 GB/s into tmpfs (bench_gpu_capture.py)
    writer_threads: int = 4
    pinned_pool_bytes: int = 2 * _GiB
    orphan_ttl_s: float = 3600.0
    assembly_ttl_s: float = 600.0
    sweep_interval_s: float = 15.0
    content_keys: bool = True
    storage: str = "native"

    MECHANISMS = ("aux_return", "layer_hooks", "legacy")
    STORAGES = ("native", "fp8", FP8_ENCODING)

    def __post_init__(self) -> None:
        if not self.staging_dir:
            raise ValueError("capture config: staging_dir is required (config key or HS_CAPTURE_STAGING_DIR)")
        if not self.hf_aux_layer_ids:
            raise ValueError("capture config: hf_aux_layer_ids is required (config key or HS_CAPTURE_LAYER_IDS)")
        ids = list(self.hf_aux_layer_ids)
        if any(b <= a for a, b in zip(ids, ids[1:])) or ids[0] < 0:
            raise ValueError(f"capture config: hf_aux_layer_ids must be ascending and >= 0, got {ids}")
        if not self.rid_prefix.startswith("hs-") or not all(c.isalnum() or c == "-" for c in self.rid_prefix):
            raise ValueError(f"capture config: rid_prefix must start with 'hs-' and hold only [a-z0-9-], got {self.rid_prefix!r}")
        if self.mechanism not in self.MECHANISMS:
            raise ValueError(f"capture config: mechanism must be one of {self.MECHANISMS}, got {self.mechanism!r}")
        for name in ("max_staging_bytes", "max_staging_files", "writer_threads"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"capture config: {name} must be >= 1")
        if self.max_wait_s < 0:
            raise ValueError("capture config: max_wait_s must be >= 0")
        if self.storage not in self.STORAGES:
            raise ValueError(f"capture config: storage must be one of {self.STORAGES}, got {self.storage!r}")

    @property
    def fp8(self) -> bool:
        """States are quantized to ``fp8_e4m3_per_token`` on the device before the copy."""
        return self.storage != "native"

    @classmethod
    def from_sources(cls, config: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> "CaptureConfig":
        config = dict(config or {})
        environ = os.environ if environ is None else environ
        unknown = set(config) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"capture config: unknown keys {sorted(unknown)}")

        def pick(key: str, env_key: str, conv):
            if key in config and config[key] is not None:
                return conv(config[key])
            raw = _env(environ, env_key)
            return conv(raw) if raw not in (None, "") else None

        def ids(v):
            if isinstance(v, str):
                return tuple(int(x) for x in v.replace(" ", ",").split(",") if x)
            return tuple(int(x) for x in v)

        def boolean(v):
            if isinstance(v, str):
                return v.strip().lower() in ("1", "true", "yes", "on")
            return bool(v)

        values: dict[str, Any] = {
            "staging_dir": pick("staging_dir", "STAGING_DIR", str),
            "hf_aux_layer_ids": pick("hf_aux_layer_ids", "LAYER_IDS", ids),
            "rid_prefix": pick("rid_prefix", "RID_PREFIX", str),
            "max_staging_bytes": pick("max_staging_bytes", "MAX_BYTES", int),
            "max_staging_files": pick("max_staging_files", "MAX_FILES", int),
            "max_wait_s": pick("max_wait_s", "MAX_WAIT_S", float),
            "writer_threads": pick("writer_threads", "WRITERS", int),
            "pinned_pool_bytes": pick("pinned_pool_bytes", "PINNED_BYTES", int),
            "orphan_ttl_s": pick("orphan_ttl_s", "ORPHAN_TTL_S", float),
            "assembly_ttl_s": pick("assembly_ttl_s", "ASSEMBLY_TTL_S", float),
            "content_keys": pick("content_keys", "CONTENT_KEYS", boolean),
            "sweep_interval_s": pick("sweep_interval_s", "SWEEP_INTERVAL_S", float),
            "storage": pick("storage", "STORAGE", str),
        }
        for key in ("mechanism", "module_path", "num_hidden_layers"):
            if config.get(key) is not None:
                values[key] = config[key]
        if config.get("sglang_aux_layer_ids") is not None:
            values["sglang_aux_layer_ids"] = ids(config["sglang_aux_layer_ids"])
        if config.get("architectures"):
            values["architectures"] = tuple(config["architectures"])
        for required, env_key in (("staging_dir", "STAGING_DIR"), ("hf_aux_layer_ids", "LAYER_IDS")):
            if not values.get(required):
                raise ValueError(f"capture config: {required} is required (config key or {ENV_PREFIX}{env_key})")
        return cls(**{k: v for k, v in values.items() if v is not None})

    def to_json(self) -> dict:
        out = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = list(value) if isinstance(value, tuple) else value
        return out


@dataclass
class BatchView:
    """What the core needs from a ForwardBatch (version-independent)."""

    mode: str  # ForwardMode name, e.g. "EXTEND"
    extend_seq_lens: list[int] | None
    extend_prefix_lens: list[int] | None = None
    rids: list[str] | None = None
    input_ids: torch.Tensor | None = None  # [total tokens] on the model's device

    @classmethod
    def from_forward_batch(cls, fb: Any, input_ids: torch.Tensor | None = None) -> "BatchView":
        mode = getattr(fb, "forward_mode", None)
        name = getattr(mode, "name", None) or str(mode)
        seq = getattr(fb, "extend_seq_lens_cpu", None)
        prefix = getattr(fb, "extend_prefix_lens_cpu", None)
        rids = getattr(fb, "rids", None)
        ids = getattr(fb, "input_ids", None)
        if ids is None:
            ids = input_ids
        return cls(
            mode=name,
            extend_seq_lens=[int(x) for x in seq] if seq is not None else None,
            extend_prefix_lens=[int(x) for x in prefix] if prefix is not None else None,
            rids=list(rids) if rids is not None else None,
            input_ids=ids,
        )


@dataclass
class _Assembly:
    rid: str
    total: int
    pieces: list[HostPiece] = field(default_factory=list)
    length: int = 0
    reserved: int = 0
    first_batch_size: int = 0
    updated: float = 0.0
    state_dtype: str = ""
    capture_cpu_ns: int = 0  # forward-thread CPU the hook spent on this request's rows, over all its chunks


@dataclass
class _Job:
    rid: str
    total: int
    pieces: list[HostPiece]
    reserved: int
    meta: dict
    state_dtype: str = ""


class CaptureCore:
    """Turns EXTEND passes into per-request dump files; one per scheduler process that writes."""

    def __init__(
        self,
        config: CaptureConfig,
        *,
        sglang_version: str = "unknown",
        extra_metadata: Mapping[str, str] | None = None,
        copier: HostCopier | None = None,
        start_threads: bool = True,
    ) -> None:
        self.config = config
        self.sglang_version = str(sglang_version)
        self.extra_metadata = dict(extra_metadata or {})
        self.staging = StagingDir(config.staging_dir)
        self.budget = StagingBudget(config.max_staging_bytes, config.max_staging_files, self.staging.usage)
        self.copier = copier or HostCopier(config.pinned_pool_bytes)
        self.stats = {
            "passes_seen": 0,
            "extend_passes": 0,
            "requests_seen": 0,
            "foreign_skipped": 0,
            "invalid_rids": 0,
            "dumps_written": 0,
            "dump_bytes": 0,
            "refused": 0,
            "max_batch_requests": 0,
            "chunks_assembled": 0,
        }
        self.verified: dict | None = None
        self._lock = threading.Lock()
        self._assemblies: dict[str, _Assembly] = {}
        self._queue: "queue.Queue[_Job | None]" = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._stop = threading.Event()
        self._warned_invalid = 0
        self._pending = 0
        self._pending_cond = threading.Condition()
        if start_threads:
            for i in range(int(config.writer_threads)):
                t = threading.Thread(target=self._writer_loop, name=f"hs-dump-writer-{i}", daemon=True)
                t.start()
                self._threads.append(t)
            t = threading.Thread(target=self._sweeper_loop, name="hs-dump-sweeper", daemon=True)
            t.start()
            self._threads.append(t)
            self.budget.start_meter(name_os_thread)  # the forward thread never scans the directory

    # ------------------------------------------------------------------ forward thread

    def process(
        self,
        batch: BatchView,
        *,
        aux: torch.Tensor | Sequence[torch.Tensor] | None,
        final_prenorm: torch.Tensor | None,
        missing_reason: str | None = None,
    ) -> None:
        """Handle one forward pass. ``aux``: [N, K*H] packed, [N, K, H], or K tensors [N, H].

        ``missing_reason``: set by the glue when it knows the states are unusable for
        this pass (e.g. the final-norm hook did not fire); our requests are refused with it.
        """
        self.stats["passes_seen"] += 1
        if batch.mode != "EXTEND":
            return
        self.stats["extend_passes"] += 1
        lens = batch.extend_seq_lens
        if lens is None:
            return
        rids = batch.rids
        n = len(rids) if rids is not None else len(lens)
        n = min(n, len(lens))
        prefix = batch.extend_prefix_lens or [0] * len(lens)
        self.stats["max_batch_requests"] = max(self.stats["max_batch_requests"], n)

        ours: list[tuple[int, str, int, int, int]] = []  # (index, key, offset, length, prefix)
        offset = 0
        for i in range(n):
            length, pre = int(lens[i]), int(prefix[i])
            if rids is not None:
                key = rids[i]
                if not isinstance(key, str) or not key.startswith(self.config.rid_prefix):
                    self.stats["foreign_skipped"] += 1
                elif RID_RE.match(key) is None:
                    self.stats["invalid_rids"] += 1
                    if self._warned_invalid < 20:
                        self._warned_invalid += 1
                        logger.warning("hs_dataset capture: ignoring request with invalid rid %r (not hs-<run>-<seq>-<T>)", key[:120])
                else:
                    ours.append((i, key, offset, length, pre))
            elif self.config.content_keys and pre == 0 and batch.input_ids is not None:
                ours.append((i, "", offset, length, pre))  # keyed by content below
            offset += length
        self.stats["requests_seen"] += n
        if not ours:
            return
        total_rows = offset

        cpu_start = time.thread_time_ns()  # what the hook costs the forward thread, reported per dump
        try:
            aux3, final = self._normalize(aux, final_prenorm, total_rows, missing_reason)
        except _Refuse as exc:
            for _, key, *_ in ours:
                if key:
                    self._refuse(key, str(exc))
            return

        state_dtype = str(aux3.dtype).replace("torch.", "")
        if self.config.fp8:
            # One quantization for the whole pass, on the device: per-token scales make it
            # row-wise, so each request's rows of the result are its own encoding.
            aux_q, aux_s = quantize_fp8_per_token(aux3[:total_rows])
            final_q, final_s = quantize_fp8_per_token(final[:total_rows])
            states = {"aux": aux_q, "aux_scale": aux_s, "final": final_q, "final_scale": final_s}
            owned: tuple[str, ...] = tuple(states)
        else:
            states = {"aux": aux3, "final": final}
            owned = ()
        deadline = time.monotonic() + self.config.max_wait_s
        rows_ours = sum(length for *_, length, _pre in ours)
        pass_cpu = time.thread_time_ns() - cpu_start  # the pass's own part (stacking the layers, the fp8 quantizer), shared by rows
        for _, key, off, length, pre in ours:
            rows = slice(off, off + length)
            if not key:
                key = content_key(batch.input_ids[rows])
                total = length
            else:
                total = rid_num_tokens(key)
            tensors = {"input_ids": batch.input_ids[rows], **{name: t[rows] for name, t in states.items()}}
            self._handle_request(
                key, total, pre, length, tensors, owned, state_dtype, n, deadline,
                cpu_shared=pass_cpu * length // max(rows_ours, 1), cpu_started=time.thread_time_ns(),
            )

    def _normalize(self, aux, final, total_rows: int, missing_reason: str | None):
        cfg = self.config
        k = len(cfg.hf_aux_layer_ids)
        if missing_reason:
            raise _Refuse(missing_reason)
        if final is None:
            raise _Refuse("no pre-norm final state was captured for this pass")
        if aux is None:
            raise _Refuse("no aux hidden states were captured for this pass (is aux capture enabled on the server?)")
        if final.dim() != 2:
            raise _Refuse(f"pre-norm final state has shape {tuple(final.shape)}, expected [tokens, hidden]")
        h = final.shape[1]
        if isinstance(aux, (list, tuple)):
            if len(aux) != k:
                raise _Refuse(f"captured {len(aux)} aux layers, configured {k} ({list(cfg.hf_aux_layer_ids)})")
            aux = torch.stack([a.reshape(a.shape[0], -1) for a in aux], dim=1)
        if aux.dim() == 2:
            if aux.shape[1] != k * h:
                raise _Refuse(
                    f"aux hidden states are {aux.shape[1]} wide, expected {k} layers x {h} = {k * h}: the server "
                    f"captures a different number of layers than configured ({list(cfg.hf_aux_layer_ids)})"
                )
            aux = aux.view(aux.shape[0], k, h)
        if aux.dim() != 3 or aux.shape[1] != k or aux.shape[2] != h:
            raise _Refuse(f"aux hidden states have shape {tuple(aux.shape)}, expected [tokens, {k}, {h}]")
        if aux.shape[0] < total_rows or final.shape[0] < total_rows:
            raise _Refuse(
                f"states cover {min(aux.shape[0], final.shape[0])} tokens but the batch extends {total_rows}: "
                "the states are token-scattered across ranks (DP-attention / sequence-parallel layouts are not supported)"
            )
        if self.verified is None:
            self.verified = {
                "aux_layers": k,
                "hidden_size": int(h),
                "dtype": str(aux.dtype).replace("torch.", ""),
                "hf_aux_layer_ids": list(cfg.hf_aux_layer_ids),
                "sglang_aux_layer_ids": list(cfg.sglang_aux_layer_ids) if cfg.sglang_aux_layer_ids else None,
            }
            logger.info(
                "hs_dataset capture: first prefill verified: %d aux layers (HF hidden_states %s, sglang ids %s), "
                "hidden %d, dtype %s, final pre-norm; staging %s",
                k,
                list(cfg.hf_aux_layer_ids),
                self.verified["sglang_aux_layer_ids"],
                h,
                self.verified["dtype"],
                cfg.staging_dir,
            )
        return aux, final

    def _handle_request(self, rid, total, pre, length, tensors, owned, state_dtype, batch_requests, deadline, *, cpu_shared: int, cpu_started: int) -> None:
        # staged bytes of these rows (ids counted as int64, as the dump stores them)
        nbytes = length * 8 + sum(t.numel() * t.element_size() for name, t in tensors.items() if name != "input_ids")
        with self._lock:
            asm = self._assemblies.get(rid)
            if pre == 0:
                if asm is not None:  # re-prefilled from scratch (e.g. retracted): start over
                    self._drop_assembly_locked(rid)
                    asm = None
                if length > total:
                    self._refuse(rid, f"the prefill has {length} tokens but the request id says {total}")
                    return
            else:
                if asm is None or asm.length != pre:
                    if asm is not None:
                        self._drop_assembly_locked(rid)
                    self._refuse(
                        rid,
                        f"partial prompt: the first {pre} of {total} tokens were not computed in this request "
                        "(prefix-cache hit); restart the server with --disable-radix-cache, or send requests with "
                        "return_logprob and logprob_start_len 0 to force a full prefill",
                    )
                    return
                if pre + length > total:
                    self._drop_assembly_locked(rid)
                    self._refuse(rid, f"chunks add up to {pre + length} tokens but the request id says {total}")
                    return
            left = max(0.0, deadline - time.monotonic())
            first = pre == 0
            if not self.budget.reserve(nbytes, left, nfiles=1 if first else 0):
                if asm is not None:
                    self._drop_assembly_locked(rid)
                snap = self.budget.snapshot()
                self._refuse(
                    rid,
                    f"{REFUSED_STAGING_FULL}: {snap['disk_files']} files / {snap['disk_bytes']} bytes waiting in "
                    f"{self.config.staging_dir} (limits {self.config.max_staging_files} files / "
                    f"{self.config.max_staging_bytes} bytes) and no room freed within {self.config.max_wait_s} s; "
                    "the client is not draining dumps fast enough",
                )
                return
            piece = self.copier.snapshot(tensors, left, owned=owned)
            if piece is None:
                self.budget.release(nbytes, 1 if first else 0)
                if asm is not None:
                    self._drop_assembly_locked(rid)
                self._refuse(rid, f"{REFUSED_NO_HOST_BUFFER} (pinned_pool_bytes too small for the load)")
                return
            if first:
                asm = _Assembly(rid=rid, total=total, first_batch_size=batch_requests, state_dtype=state_dtype)
            asm.pieces.append(piece)
            asm.length += length
            asm.reserved += nbytes
            asm.capture_cpu_ns += cpu_shared + time.thread_time_ns() - cpu_started
            asm.updated = time.monotonic()
            if asm.length < total:
                self._assemblies[rid] = asm
                return
            self._assemblies.pop(rid, None)
            if len(asm.pieces) > 1:
                self.stats["chunks_assembled"] += 1
        meta = {"prefill_batch_requests": str(asm.first_batch_size), "num_chunks": str(len(asm.pieces)), "capture_cpu_ns": str(asm.capture_cpu_ns)}
        with self._pending_cond:
            self._pending += 1
        self._queue.put(_Job(rid=rid, total=total, pieces=asm.pieces, reserved=asm.reserved, meta=meta, state_dtype=asm.state_dtype))

    def _drop_assembly_locked(self, rid: str) -> None:
        asm = self._assemblies.pop(rid, None)
        if asm is None:
            return
        for p in asm.pieces:
            p.release()
        self.budget.release(asm.reserved, 1)

    def _refuse(self, rid: str, reason: str) -> None:
        self.stats["refused"] += 1
        logger.warning("hs_dataset capture: refused %s: %s", rid, reason)
        if not rid or RID_RE.match(rid) is None:
            return
        try:
            self.staging.write_refusal(rid, reason)
        except OSError as exc:
            logger.error("hs_dataset capture: cannot write refusal marker for %s: %s", rid, exc)

    # ------------------------------------------------------------------ writer threads

    def _writer_loop(self) -> None:
        name_os_thread("hs-dump-writer")
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self._write(job)
            except Exception as exc:  # never let a writer thread die silently
                logger.exception("hs_dataset capture: writing %s failed", job.rid)
                self.budget.release(job.reserved, 1)
                self._refuse(job.rid, f"{REFUSED_WRITE_FAILED}: {type(exc).__name__}: {exc}")
            finally:
                for p in job.pieces:
                    p.release()
                with self._pending_cond:
                    self._pending -= 1
                    self._pending_cond.notify_all()

    def _write(self, job: _Job) -> None:
        """Write one dump: its safetensors header, then each tensor's rows straight from host memory.

        The file is exactly what ``safetensors.torch.save`` made of the same tensors and
        metadata (tests/test_staging_writev.py), written with ``os.writev`` from the
        pinned buffers of the request's pieces (one per prefill chunk) -- no
        concatenation, no serialized copy.
        """
        parts = [p.wait() for p in job.pieces]
        tokens = sum(int(p["input_ids"].shape[0]) for p in parts)
        if tokens != job.total:
            raise RuntimeError(f"assembled {tokens} tokens, expected {job.total}")
        fp8 = "aux_scale" in parts[0]
        aux0 = parts[0]["aux"]
        k, h = int(aux0.shape[1]), int(aux0.shape[2])

        def column(name: str, dtype: torch.dtype | None = None) -> list[torch.Tensor]:
            # the rows of every piece, in order; a dtype change (rare: int32 ids) costs a host copy
            return [p[name] if dtype is None or p[name].dtype == dtype else p[name].to(dtype) for p in parts]

        columns: dict[str, list[torch.Tensor]] = {
            "input_ids": column("input_ids", torch.int64),
            "aux_hidden_states": column("aux"),
            "final_hidden_state": column("final", None if fp8 else aux0.dtype),
        }
        shapes: dict[str, tuple[int, ...]] = {"input_ids": (tokens,), "aux_hidden_states": (tokens, k, h), "final_hidden_state": (tokens, h)}
        if fp8:
            columns["aux_hidden_states" + SCALE_SUFFIX] = column("aux_scale")
            columns["final_hidden_state" + SCALE_SUFFIX] = column("final_scale")
            shapes["aux_hidden_states" + SCALE_SUFFIX] = (tokens, k)
            shapes["final_hidden_state" + SCALE_SUFFIX] = (tokens,)
        metadata = {
            "format": DUMP_FORMAT,
            "version": DUMP_VERSION,
            "rid": job.rid,
            "hf_aux_layer_ids": json.dumps(list(self.config.hf_aux_layer_ids)),
            "final_state": "pre_norm",
            "sglang_version": self.sglang_version,
            "dtype": job.state_dtype or str(aux0.dtype).replace("torch.", ""),
            "mechanism": self.config.mechanism,
            **({STATE_ENCODING_KEY: FP8_ENCODING} if fp8 else {}),
            **self.extra_metadata,
            **job.meta,
        }
        entries = [
            (name, from_torch(ts[0].dtype).safetensors, shapes[name], sum(t.numel() * t.element_size() for t in ts)) for name, ts in columns.items()
        ]
        header, order = dump_header(entries, metadata)
        buffers = [header] + [host_bytes(t.contiguous()) for name in order for t in columns[name]]  # views keep their tensors alive
        written = self.staging.write_atomic(job.rid + DUMP_SUFFIX, buffers)
        if written:
            size = len(header) + sum(e[3] for e in entries)
            self.budget.committed(job.reserved, 1)
            self.stats["dumps_written"] += 1
            self.stats["dump_bytes"] += size
        else:  # a dump for this rid already exists (the request was prefilled twice): keep the first
            self.budget.release(job.reserved, 1)

    # ------------------------------------------------------------------ housekeeping

    def _sweeper_loop(self) -> None:
        name_os_thread("hs-dump-sweeper")
        # an Event, not sleep: close() wakes it, so no sweep runs on a closed staging fd
        while not self._stop.wait(self.config.sweep_interval_s):
            try:
                self.sweep()
            except Exception:  # pragma: no cover
                logger.exception("hs_dataset capture: sweeping the staging directory failed")

    def sweep(self, now: float | None = None) -> None:
        """Expire stale chunk assemblies (refused) and unclaimed staging files (deleted)."""
        now_mono = time.monotonic() if now is None else now
        with self._lock:
            stale = [r for r, a in self._assemblies.items() if now_mono - a.updated > self.config.assembly_ttl_s]
            for rid in stale:
                asm = self._assemblies[rid]
                self._drop_assembly_locked(rid)
                self._refuse(rid, f"incomplete chunked prefill: {asm.length} of {asm.total} tokens arrived, then nothing for {self.config.assembly_ttl_s} s")
        self.staging.sweep(self.config.orphan_ttl_s, spare_max_age_s=self.config.sweep_interval_s)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued dump is written (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        with self._pending_cond:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._pending_cond.wait(left)
        return True

    def close(self, timeout: float = 30.0) -> None:
        if self._closed:
            return
        self.flush(timeout)
        self._closed = True
        self._stop.set()
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            if t.name == "hs-dump-sweeper":
                t.join(timeout=5)  # a sweep in progress finishes before its fd closes
        self.budget.stop_meter()  # likewise its scan
        self.staging.close()


class _Refuse(Exception):
    pass

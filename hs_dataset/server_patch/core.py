"""The capture core: per-request dumps from prefill forward passes.

Runs inside SGLang scheduler processes; imports only stdlib and torch (and its
siblings in this package). The SGLang-facing glue lives in
:mod:`hs_dataset.server_patch.hooks` (0.5.9+) and
:mod:`hs_dataset.server_patch.legacy.hook` (<= 0.5.5, called by the AST patch); both
reduce a forward pass to a :class:`~hs_dataset.server_patch.batch.BatchView` plus
tensors and call :meth:`CaptureCore.process`.

What :meth:`CaptureCore.process` does, on the forward thread:

1. handles the extend-shaped passes (:data:`~hs_dataset.server_patch.batch.PREFILL_MODES`:
   ``EXTEND``, and ``MIXED`` -- mixed chunked prefill, new prompt rows followed by
   1-row decode tails of running requests) and ignores every other (decode,
   target-verify, idle, ...);
2. splits the batch per request by ``extend_seq_lens``
   (:func:`~hs_dataset.server_patch.batch.split_requests`); ignores requests whose rid
   lacks our prefix (warm-up, health checks, other clients) and logs rids that have
   the prefix but fail the strict :data:`~hs_dataset.server_patch.contract.rid.RID_RE`
   check (never used in a file name);
3. a request seen whole (prefix length 0, all ``T`` tokens of its rid) is stored; a
   chunked prefill (prefix length == tokens assembled so far) is assembled across
   passes and stored once complete; a row at or past the rid's ``T`` tokens is a decode
   step of a prompt already stored (a mixed pass's tail) and is skipped, counted
   ``decode_tails``; anything else -- a prefix-cache hit, a chunk out of order, more
   tokens than the rid says -- is refused with a marker;
4. reserves room in the bounded staging budget (waiting at most ``max_wait_s`` per
   forward pass in total), snapshots the rows to host memory (see :mod:`.copier`),
   and hands them to the writer threads (:mod:`.dump_writer`) that write
   ``{rid}.safetensors`` atomically. No room in time -> a refusal marker.

With ``storage: fp8`` (or a 4-bit ``mxfp4`` / ``nf4``) the states of the whole pass are
quantized on the device (:func:`~hs_dataset.server_patch.states.pass_states`, the
dataset's own encoding) before the copy: half (about a quarter) of the PCIe, pinned and
staging bytes of bf16, and the client stores them as they are.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from hs_dataset.libc import name_os_thread
from hs_dataset.server_patch.batch import (
    DECODE_MODE,
    PREFILL_MODES,
    BatchSplit,
    BatchView,
    RequestSlice,
    RidKinds,
    split_decode,
    split_requests,
)
from hs_dataset.server_patch.budget import StagingBudget
from hs_dataset.server_patch.config import CaptureConfig
from hs_dataset.server_patch.contract.dump import REFUSED_NO_HOST_BUFFER, REFUSED_STAGING_FULL
from hs_dataset.server_patch.contract.rid import RID_RE, content_key, rid_num_tokens
from hs_dataset.server_patch.copier import HostCopier, HostPiece, to_device
from hs_dataset.server_patch.dump_writer import DumpJob, DumpWriter
from hs_dataset.server_patch.one_pass import PieceCollector
from hs_dataset.server_patch.reporter import StatusReporter
from hs_dataset.server_patch.row_record import RECORD, RecordLayout, packed, row_columns
from hs_dataset.server_patch.staging import StagingDir
from hs_dataset.server_patch.states import UnusableStates, normalize_states, pass_states

__all__ = ["CaptureCore"]

logger = logging.getLogger("hs_dataset.server_patch")

_INVALID_RID_WARNINGS = 20  # logged per process; counted in stats["invalid_rids"] beyond that


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


class _PassInfo(NamedTuple):
    """What every request of one pass shares."""

    requests: int  # requests in the pass (recorded with each dump)
    state_dtype: str  # dtype the model computed the states in
    owned: tuple[str, ...]  # state tensors made for this copy (fp8): no device snapshot needed
    deadline: float  # time.monotonic() by which the pass's reservations and copies must succeed


class _RequestRows:
    """One request's slice of a pass, ready to stage.

    One is made per request on the forward thread: a plain slotted class, the cheapest
    record to build (a frozen dataclass costs several times as much).
    """

    __slots__ = ("cpu_shared_ns", "cpu_started_ns", "length", "prefix", "rid", "tensors", "total")

    def __init__(
        self, rid: str, total: int, prefix: int, length: int, tensors: dict[str, torch.Tensor], cpu_shared_ns: int, cpu_started_ns: int
    ) -> None:
        self.rid = rid  # the rid, or the content key of a batch without rids
        self.total = total  # tokens of the whole request
        self.prefix = prefix  # tokens before these rows (chunked prefill)
        self.length = length  # rows in this slice
        self.tensors = tensors  # "input_ids" and the state rows, views into the pass's tensors
        self.cpu_shared_ns = cpu_shared_ns  # this request's share of the pass's own forward-thread CPU
        self.cpu_started_ns = cpu_started_ns  # time.thread_time_ns() when the request's own part began


class _BlockLayout:
    """Where one-pass requests' rows lie in a pass (a slice where they are one run, else an index on the device), and
    where each request's rows lie in the block copied to the host: ``(rid, first row, rows)``."""

    __slots__ = ("owners", "rows")

    def __init__(self, rows: slice | torch.Tensor, owners: list[tuple[str, int, int]]) -> None:
        self.rows = rows
        self.owners = owners

    @classmethod
    def of(cls, slices: list[RequestSlice], device: torch.device) -> _BlockLayout:
        """Why no list of row numbers: a prefill pass holds thousands of rows, and listing them in Python cost the
        forward thread 0.75 ms (one run) to 3.05 ms (gathered) a pass of 8,192 rows on the CI VM
        (``benchmarks/bench_one_pass_collector.py``, docs/BENCHMARKS.md)."""
        owners, start = [], 0
        for request in slices:
            owners.append((request.key, start, request.length))
            start += request.length
        held = [request for request in slices if request.length]
        if all(b.offset == a.offset + a.length for a, b in itertools.pairwise(held)):
            first = held[0].offset if held else 0
            return cls(slice(first, first + start), owners)
        if all(request.length == 1 for request in held):  # a decode step: one row each
            return cls(to_device(torch.tensor([request.offset for request in held]), device), owners)
        offsets = torch.tensor([request.offset for request in held])
        lengths = torch.tensor([request.length for request in held])
        shift = offsets - (torch.cumsum(lengths, 0) - lengths)  # row i of the block lies at i + its request's shift
        return cls(to_device(torch.repeat_interleave(shift, lengths) + torch.arange(start), device), owners)

    def on(self, device: torch.device) -> bool:
        """Whether its row index can select rows of a pass on ``device``."""
        return isinstance(self.rows, slice) or self.rows.device == device


class _DecodePlan:
    """How the last decode step's rows map to one-pass requests, reused while the next step is the same batch.

    Why: a decode step holds the same requests, in the same order, for many steps in a row; splitting
    them again, checking each for a refusal and listing its row cost the forward thread about half of
    its capture time a step (128 requests). The plan is reused only when the step's rids equal the
    plan's (same requests, same order: the same rows), no request was refused since it was made, and
    no prefill pass came between (that drops the plan); the positions and ids are read from each
    step's own batch.
    """

    __slots__ = ("kept", "layout", "refusals", "rids", "split")

    def __init__(self, rids: list, refusals: int, split: BatchSplit, kept: list[RequestSlice]) -> None:
        self.rids = rids
        self.refusals = refusals
        self.split = split
        self.kept = kept  # the one-pass requests whose rows are kept (the refused left out)
        self.layout: _BlockLayout | None = None  # where their rows are, made at the first step that copies them


class CaptureCore:
    """Turns prefill (EXTEND, MIXED) passes into per-request dump files; one per scheduler process that writes."""

    def __init__(
        self,
        config: CaptureConfig,
        *,
        sglang_version: str = "unknown",
        extra_metadata: Mapping[str, str] | None = None,
        copier: HostCopier | None = None,
        start_threads: bool = True,
        status_writer: str = "dp0",
        facts: Mapping[str, object] | None = None,
    ) -> None:
        """``status_writer``: this process's name in the status file (``dp<attention-DP rank>``); ``facts``: what the
        glue read of the SGLang it runs in, reported there (``server_patch/contract/status.py``)."""
        self.config = config
        self._rid_kinds = RidKinds(config.rid_prefix)
        self.sglang_version = str(sglang_version)
        self.extra_metadata = dict(extra_metadata or {})
        self.staging = StagingDir(config.staging_dir)
        self.budget = StagingBudget(config.max_staging_bytes, config.max_staging_files, self.staging.usage)
        self.copier = copier or HostCopier(config.pinned_pool_bytes)
        self._owns_copier = copier is None  # a copier handed in outlives this core (a server's, a benchmark's phases)
        self.stats = {
            "passes_seen": 0,
            "extend_passes": 0,
            "decode_passes": 0,
            "graph_decode_passes": 0,  # of which replayed in a decode CUDA graph, read from its static rows after the replay
            "graph_decode_rows": 0,  # the rows of those replays (every request's, ours or not)
            "requests_seen": 0,
            "foreign_skipped": 0,
            "decode_tails": 0,  # rows of our rids past their prompt (mixed passes' decode tails): skipped, not refused
            "invalid_rids": 0,
            "dumps_written": 0,
            "dump_bytes": 0,
            "refused": 0,
            "max_batch_requests": 0,
            "chunks_assembled": 0,
            "hook_errors": 0,
            "unusable_passes": 0,
            "hook_wall_ns": 0,  # forward-thread wall time inside the hooks (all of them, waits included)
            "replay_hook_wall_ns": 0,  # of which after decode graph replays (the rest: eager passes, prefill above all)
            "reserve_ns": 0,  # of which reserving staging room (waits for the client included: back-pressure)
            "copy_ns": 0,  # and taking host memory and issuing the copies to it (waits for a free range included)
            "staging_peak_bytes": 0,  # most staging bytes reserved or waiting at once (bound: max_staging_bytes)
            "pinned_peak_bytes": 0,  # most host copy memory held at once (bound: pinned_pool_bytes)
        }
        self.reporter = StatusReporter(
            config.staging_dir,
            status_writer,
            self.stats,
            facts or {},
            {
                "sglang_version": self.sglang_version,
                "mechanism": config.mechanism,
                "rid_prefix": config.rid_prefix,
                "hf_aux_layer_ids": list(config.hf_aux_layer_ids),
                "content_keys": bool(config.content_keys),
                "max_staging_bytes": config.max_staging_bytes,
                "pinned_pool_bytes": config.pinned_pool_bytes,
            },
        )
        self.verified: dict | None = None
        self.writer = DumpWriter(
            config,
            self.staging,
            self.budget,
            sglang_version=self.sglang_version,
            extra_metadata=self.extra_metadata,
            stats=self.stats,
            refuse=self._refuse,
            written=self.reporter.recent_dumps.append,
        )
        # None: decode steps reach the hooks, so one-pass requests are kept; else why they are refused (the glue sets it)
        self.one_pass_refusal: str | None = None
        self._plan: _DecodePlan | None = None  # the last decode step's (forward thread)
        self.collector = PieceCollector(
            budget=self.budget,
            writer=self.writer,
            stats=self.stats,
            refuse=self._refuse,
            piece_rows=config.one_pass_piece_rows,
            max_held_bytes=config.one_pass_held_bytes,
            max_wait_s=config.max_wait_s,
            start_thread=start_threads,
        )
        self._lock = threading.Lock()
        self._assemblies: dict[str, _Assembly] = {}
        self._sweeper: threading.Thread | None = None
        self._closed = False
        self._stop = threading.Event()
        self._warned_invalid = 0
        if start_threads:
            self.writer.start(config.writer_threads)
            self._sweeper = threading.Thread(target=self._sweeper_loop, name="hs-dump-sweeper", daemon=True)
            self._sweeper.start()
            self.budget.start_meter(name_os_thread)  # the forward thread never scans the directory
            self.reporter.start(name_os_thread)

    # ------------------------------------------------------------------ forward thread

    def process(
        self,
        batch: BatchView,
        *,
        aux: torch.Tensor | Sequence[torch.Tensor] | None,
        final_prenorm: torch.Tensor | None,
        missing_reason: str | None = None,
        aux_owned: bool = False,
    ) -> None:
        """Handle one forward pass. ``aux``: [N, K*H] packed, [N, K, H], or K tensors [N, H].

        ``aux_owned``: ``aux`` was made for this capture (the layer hooks' buffer), so
        nothing else writes it and its rows are copied without a device snapshot.

        ``missing_reason``: set by the glue when it knows the states are unusable for
        this pass (e.g. the final-norm hook did not fire); our requests are refused with it.
        """
        self.stats["passes_seen"] += 1
        decode = batch.mode == DECODE_MODE
        if batch.mode not in PREFILL_MODES and not decode:
            return
        plan = None
        if decode:
            self.stats["decode_passes"] += 1
            plan = self._decode_plan(batch)
            split = plan.split
        else:
            self._plan = None  # the collector learns of this pass's one-pass requests: the next step's plan is made anew
            self.stats["extend_passes"] += 1
            if missing_reason:  # reported whoever's rows the pass held: a graph replay may hand over no rids at all
                self.stats["unusable_passes"] += 1
                self.reporter.unusable(missing_reason)
            if batch.extend_seq_lens is None:
                return
            split = split_requests(batch, self._rid_kinds, self.config.content_keys)
        if not decode:  # a decode step's requests were counted at their prefill
            self._count(split)
        if plan is not None:
            generating = plan.kept
            ours: list[tuple[RequestSlice, int]] = []
        else:
            generating = [r for r in split.ours if r.one_pass]
            self.collector.extended(r.key for r in generating)
            ours = self._prompt_rows([r for r in split.ours if not r.one_pass])
            generating = self._generating_rows(generating)
        if not ours and not generating:
            return

        cpu_start = time.thread_time_ns()  # what the hook costs the forward thread, reported per dump
        try:
            if missing_reason:
                raise UnusableStates(missing_reason)
            aux3, final = normalize_states(aux, final_prenorm, self.config.hf_aux_layer_ids, split.rows)
        except UnusableStates as exc:
            for request, _ in ours:
                if request.key:
                    self._refuse(request.key, str(exc))
            for request in generating:
                self.collector.refuse(request.key, str(exc))
            return
        if self.verified is None:
            self._verify_first(aux3)

        states, owned = pass_states(aux3, final, split.rows, self.config.state_encoding, aux_owned=aux_owned)
        pass_ = _PassInfo(split.requests, str(aux3.dtype).replace("torch.", ""), owned, time.monotonic() + self.config.max_wait_s)
        if generating:
            self._keep_generated_rows(batch, generating, states, pass_, plan)
        rows_ours = sum(request.length for request, _ in ours)
        pass_cpu = time.thread_time_ns() - cpu_start  # the pass's own part (stacking the layers, the fp8 quantizer), shared by rows
        for (key, off, length, pre, _), total in ours:
            rows = slice(off, off + length)
            if not key:
                key = content_key(batch.input_ids[rows])
            tensors = {"input_ids": batch.input_ids[rows], **{name: t[rows] for name, t in states.items()}}
            share = pass_cpu * length // max(rows_ours, 1)
            self._handle_request(_RequestRows(key, total, pre, length, tensors, share, time.thread_time_ns()), pass_)

    def process_record(self, batch: BatchView, record: torch.Tensor, layout: RecordLayout, state_dtype: str) -> None:
        """Handle a decode step replayed in a CUDA graph: ``record [B, row_bytes]``, one packed row per request of ``batch``.

        Each row holds the request's token id, position and (encoded) states
        (:mod:`.row_record`), packed by the graph. The one-pass requests' rows go to the
        host as one copy; the collector files them as it files any step's.
        """
        self.stats["passes_seen"] += 1
        self.stats["decode_passes"] += 1
        plan = self._decode_plan(batch)
        if not plan.kept:
            return
        block, owners, gathered = self._block_rows(plan.kept, {RECORD: record}, plan)
        owned = (RECORD,) if gathered else ()  # a slice of the static record: the next replay overwrites it
        self._hand_over(plan.kept, owners, block[RECORD], owned, self.config.max_wait_s, layout, state_dtype, on_stream=True)

    # ------------------------------------------------------------------ one-pass requests (generations)

    def _decode_plan(self, batch: BatchView) -> _DecodePlan:
        """The last step's plan where it still holds (see :class:`_DecodePlan`), else a new one: the step split, the
        collector told which requests it holds, the refused left out."""
        rids = batch.rids or []
        plan = self._plan
        if plan is not None and plan.refusals == self.collector.refusals and self.one_pass_refusal is None and plan.rids == rids:
            return plan
        split = split_decode(batch, self._rid_kinds)
        generating = [r for r in split.ours if r.one_pass]
        self.collector.decode_step(r.key for r in generating)
        refusals = self.collector.refusals  # before the refusals the filter below may add: the plan is then made again
        self._plan = _DecodePlan(list(rids), refusals, split, self._generating_rows(generating))
        return self._plan

    def _generating_rows(self, slices: list[RequestSlice]) -> list[RequestSlice]:
        """The one-pass requests of a pass whose rows are kept: none where decode steps escape capture (refused once each)."""
        kept = []
        for request in slices:
            if self.one_pass_refusal is not None:
                self.collector.refuse(request.key, self.one_pass_refusal)
            elif not self.collector.refused(request.key):
                kept.append(request)
        return kept

    def _keep_generated_rows(
        self,
        batch: BatchView,
        slices: list[RequestSlice],
        states: Mapping[str, torch.Tensor],
        pass_: _PassInfo,
        plan: _DecodePlan | None = None,
    ) -> None:
        """Copy the pass's rows of one-pass requests to the host as one block of records, each row's id, position and states.

        Why one block per pass: a decode step holds one row per request, and one copy of
        them all costs the forward thread one snapshot instead of one per request; the
        collector's thread files the rows by request. Why records (:mod:`.row_record`):
        one tensor to copy and to file, as a decode graph's replay hands over.
        """
        if batch.input_ids is None or (batch.positions is None and batch.mode == DECODE_MODE):
            for request in slices:
                self.collector.refuse(request.key, "the pass carries no token ids or positions: its rows cannot be placed")
            return
        pass_rows = {"input_ids": batch.input_ids, **({"positions": batch.positions} if batch.positions is not None else {}), **states}
        block, owners, _ = self._block_rows(slices, pass_rows, plan)
        if batch.positions is None:  # an extend pass: each request's rows follow its cached prefix
            device = block["input_ids"].device
            block["positions"] = to_device(torch.cat([torch.arange(r.prefix, r.prefix + r.length) for r in slices]), device)
        columns, record = packed(row_columns(block.pop("input_ids"), block.pop("positions"), block))  # made for this copy: no snapshot
        wait_s = pass_.deadline - time.monotonic()
        self._hand_over(slices, owners, record, (RECORD,), wait_s, columns, pass_.state_dtype, on_stream=batch.mode == DECODE_MODE)

    def _block_rows(
        self, slices: list[RequestSlice], tensors: Mapping[str, torch.Tensor], plan: _DecodePlan | None
    ) -> tuple[dict[str, torch.Tensor], list[tuple[str, int, int]], bool]:
        """The one-pass requests' rows of each of a pass's ``tensors``, their owners in the block, and whether gathered.

        A slice where the rows are one run, else gathered on the device. A decode step's
        plan keeps where they lie while it holds (:class:`_DecodePlan`): the same owner
        list, which tells the collector the step is its last one's batch.
        """
        device = next(iter(tensors.values())).device
        layout = plan.layout if plan is not None else None
        if layout is None or not layout.on(device):
            layout = _BlockLayout.of(slices, device)
            if plan is not None:
                plan.layout = layout
        rows = layout.rows
        if isinstance(rows, slice):
            return {k: t[rows] for k, t in tensors.items()}, layout.owners, False
        return {k: t.index_select(0, rows) for k, t in tensors.items()}, layout.owners, True

    def _hand_over(
        self,
        slices: list[RequestSlice],
        owners: list[tuple[str, int, int]],
        record: torch.Tensor,
        owned: Collection[str],
        wait_s: float,
        columns: RecordLayout,
        state_dtype: str,
        *,
        on_stream: bool,
    ) -> None:
        """Start the host copy of a pass's one-pass rows (``record``: one row each, ``columns`` their layout) and give it to the
        collector; no host memory within ``wait_s`` refuses them. ``on_stream``: a decode step's (see :meth:`HostCopier.snapshot`).
        """
        piece = self.copier.snapshot({RECORD: record}, max(0.0, wait_s), owned=owned, on_stream=on_stream)
        self.stats["pinned_peak_bytes"] = max(self.stats["pinned_peak_bytes"], self.copier.peak_bytes)
        if piece is None:
            for request in slices:
                self.collector.refuse(request.key, f"{REFUSED_NO_HOST_BUFFER} (pinned_pool_bytes too small for the load)")
            return
        self.collector.take(piece, owners, columns, state_dtype)

    def _prompt_rows(self, ours: list[RequestSlice]) -> list[tuple[RequestSlice, int]]:
        """Our requests' prompt rows, each with its prompt's token count; decode tails dropped and counted.

        Mixed chunked prefill carries running requests as 1-row tails (prefix = tokens so
        far); with the overlap scheduler a capture request already stored can appear so,
        at prefix >= T. Those rows are no prompt rows: refusing them ("partial prompt")
        would race the dump already written, and wrongly.
        """
        kept = []
        for request in ours:
            total = rid_num_tokens(request.key) if request.key else request.length  # content-keyed: the whole prompt
            if request.key and request.prefix >= total:
                self.stats["decode_tails"] += 1
            else:
                kept.append((request, total))
        return kept

    def _count(self, split: BatchSplit) -> None:
        """The pass's requests in the stats; the first invalid rids in the log."""
        self.stats["max_batch_requests"] = max(self.stats["max_batch_requests"], split.requests)
        self.stats["foreign_skipped"] += split.foreign
        self.reporter.recent_foreign.extend(split.foreign_rids)
        self.stats["invalid_rids"] += len(split.invalid_rids)
        for rid in split.invalid_rids:
            if self._warned_invalid < _INVALID_RID_WARNINGS:
                self._warned_invalid += 1
                logger.warning("hs_dataset capture: ignoring request with invalid rid %r (not hs-<run>-<seq>-<T>)", rid[:120])
        self.stats["requests_seen"] += split.requests

    def _verify_first(self, aux: torch.Tensor) -> None:
        """Record (and log) what the first usable pass carried: the check that the server captures what was configured."""
        cfg = self.config
        k, h = int(aux.shape[1]), int(aux.shape[2])
        self.verified = {
            "aux_layers": k,
            "hidden_size": h,
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

    def _handle_request(self, rows: _RequestRows, pass_: _PassInfo) -> None:
        """Stage one request's rows; queue its dump once all its tokens are there."""
        # staged bytes of these rows (ids counted as int64, as the dump stores them)
        nbytes = rows.length * 8 + sum(t.numel() * t.element_size() for name, t in rows.tensors.items() if name != "input_ids")
        with self._lock:
            asm = self._add_rows_locked(rows, pass_, nbytes)
            if asm is None:
                return
            if asm.length < rows.total:
                self._assemblies[rows.rid] = asm
                return
            self._assemblies.pop(rows.rid, None)
            if len(asm.pieces) > 1:
                self.stats["chunks_assembled"] += 1
        meta = {
            "prefill_batch_requests": str(asm.first_batch_size),
            "num_chunks": str(len(asm.pieces)),
            "capture_cpu_ns": str(asm.capture_cpu_ns),
        }
        self.writer.submit(
            DumpJob(rid=rows.rid, total=rows.total, pieces=asm.pieces, reserved=asm.reserved, meta=meta, state_dtype=asm.state_dtype)
        )

    def _add_rows_locked(self, rows: _RequestRows, pass_: _PassInfo, nbytes: int) -> _Assembly | None:
        """The request's assembly with these rows reserved, copied and added; None once they are refused."""
        asm = self._assemblies.get(rows.rid)
        refusal = self._chunk_refusal_locked(rows, asm)
        if refusal is not None:
            self._refuse(rows.rid, refusal)
            return None
        if rows.prefix == 0:
            asm = None  # dropped above if there was one
        left = max(0.0, pass_.deadline - time.monotonic())
        first = rows.prefix == 0
        staged = time.perf_counter_ns()
        reserved = self.budget.reserve(nbytes, left, nfiles=1 if first else 0)
        self.stats["reserve_ns"] += time.perf_counter_ns() - staged
        if not reserved:
            if asm is not None:
                self._drop_assembly_locked(rows.rid)
            self._refuse(rows.rid, self._staging_full_reason())
            return None
        staged = time.perf_counter_ns()
        piece = self.copier.snapshot(rows.tensors, left, owned=pass_.owned)
        self.stats["copy_ns"] += time.perf_counter_ns() - staged
        # high-water marks, so a run can show its bounds held (the status file carries them)
        self.stats["staging_peak_bytes"] = max(self.stats["staging_peak_bytes"], self.budget.peak_bytes)
        self.stats["pinned_peak_bytes"] = max(self.stats["pinned_peak_bytes"], self.copier.peak_bytes)
        if piece is None:
            self.budget.release(nbytes, 1 if first else 0)
            if asm is not None:
                self._drop_assembly_locked(rows.rid)
            self._refuse(rows.rid, f"{REFUSED_NO_HOST_BUFFER} (pinned_pool_bytes too small for the load)")
            return None
        if first:
            asm = _Assembly(rid=rows.rid, total=rows.total, first_batch_size=pass_.requests, state_dtype=pass_.state_dtype)
        asm.pieces.append(piece)
        asm.length += rows.length
        asm.reserved += nbytes
        asm.capture_cpu_ns += rows.cpu_shared_ns + time.thread_time_ns() - rows.cpu_started_ns
        asm.updated = time.monotonic()
        return asm

    def _chunk_refusal_locked(self, rows: _RequestRows, asm: _Assembly | None) -> str | None:
        """Why these rows cannot start or continue the request's assembly (dropping what it held), or None.

        A request's first rows (prefix 0) start over whatever was assembled (a
        re-prefill, e.g. after a retraction); later rows must continue exactly where
        the assembly stopped, within the tokens the rid names.
        """
        if rows.prefix == 0:
            if asm is not None:  # re-prefilled from scratch (e.g. retracted): start over
                self._drop_assembly_locked(rows.rid)
            if rows.length > rows.total:
                return f"the prefill has {rows.length} tokens but the request id says {rows.total}"
            return None
        if asm is None or asm.length != rows.prefix:
            if asm is not None:
                self._drop_assembly_locked(rows.rid)
            return (
                f"partial prompt: the first {rows.prefix} of {rows.total} tokens were not computed in this request "
                "(prefix-cache hit); restart the server with --disable-radix-cache, or send requests with "
                "return_logprob and logprob_start_len 0 to force a full prefill"
            )
        if rows.prefix + rows.length > rows.total:
            self._drop_assembly_locked(rows.rid)
            return f"chunks add up to {rows.prefix + rows.length} tokens but the request id says {rows.total}"
        return None

    def _staging_full_reason(self) -> str:
        snap = self.budget.snapshot()
        cfg = self.config
        return (
            f"{REFUSED_STAGING_FULL}: {snap['disk_files']} files / {snap['disk_bytes']} bytes waiting in "
            f"{cfg.staging_dir} (limits {cfg.max_staging_files} files / "
            f"{cfg.max_staging_bytes} bytes) and no room freed within {cfg.max_wait_s} s; "
            "the client is not draining dumps fast enough"
        )

    def _drop_assembly_locked(self, rid: str) -> None:
        asm = self._assemblies.pop(rid, None)
        if asm is None:
            return
        for p in asm.pieces:
            p.release()
        self.budget.release(asm.reserved, 1)

    def hook_failed(self, message: str) -> None:
        """The glue's hook raised (the forward went on): counted and reported, so a waiting client can say why."""
        self.stats["hook_errors"] += 1
        self.reporter.error(message)

    def _refuse(self, rid: str, reason: str) -> None:
        self.stats["refused"] += 1
        self.reporter.recent_refused.append(rid)
        logger.warning("hs_dataset capture: refused %s: %s", rid, reason)
        if not rid or RID_RE.match(rid) is None:
            return
        try:
            self.staging.write_refusal(rid, reason)
        except OSError as exc:
            logger.error("hs_dataset capture: cannot write refusal marker for %s: %s", rid, exc)

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
                self._refuse(
                    rid,
                    f"incomplete chunked prefill: {asm.length} of {asm.total} tokens arrived, then nothing for {self.config.assembly_ttl_s} s",
                )
        self.staging.sweep(self.config.orphan_ttl_s, spare_max_age_s=self.config.sweep_interval_s)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued dump, and every one-pass row held, is written (tests, shutdown)."""
        return self.collector.flush(timeout) and self.writer.flush(timeout)

    def close(self, timeout: float = 30.0) -> None:
        if self._closed:
            return
        self.collector.close(timeout)
        self.flush(timeout)
        self._closed = True
        self._stop.set()
        self.writer.stop()
        if self._sweeper is not None:
            self._sweeper.join(timeout=5)  # a sweep in progress finishes before its fd closes
        self.budget.stop_meter()  # likewise its scan
        self.reporter.stop()
        self.staging.close()
        if self._owns_copier:
            self.copier.close()

"""``--forward-hooks`` factories that connect SGLang 0.5.9+ to the capture core.

Imported inside SGLang scheduler processes: stdlib, torch, sglang and the stdlib/torch
siblings of this package only. ``hs-dataset serve`` writes the hook specs; by hand::

    --forward-hooks '[
      {"name": "hs_capture_final", "target_modules": ["model.norm"],
       "hook_factory": "hs_dataset.server_patch.hooks:norm_hook", "config": CFG},
      {"name": "hs_capture", "target_modules": ["model"],
       "hook_factory": "hs_dataset.server_patch.hooks:model_hook", "config": CFG}]'

(``model`` -> ``language_model.model`` for Kimi-K2.5.) All specs of one server must carry
the same ``CFG`` (see :class:`~hs_dataset.server_patch.config.CaptureConfig`).

Mechanisms (``CFG["mechanism"]``, a :class:`~hs_dataset.server_patch.contract.mechanism.Mechanism`):
what differs between them -- the server arguments each refuses and how the model hook
obtains a pass's aux states -- is the mechanism's object in
:mod:`hs_dataset.server_patch.mechanisms` (``aux_return``: SGLang 0.5.23+ returns them;
``layer_hooks``: 0.5.9 - 0.5.19, one ``layer_hook`` spec per aux id with
``CFG["hook_hf_id"]``). What differs between SGLang releases is read once by
:mod:`hs_dataset.server_patch.compat`.

With no aux layer (``hf_aux_layer_ids: []``, the final state only) either mechanism
runs without aux flags or layer hooks: the norm hook alone supplies the state, and
the aux part of every dump is an empty ``[T, 0, H]``.

The ``model`` hook receives the ForwardBatch, so it is where a pass is split into
requests and handed to the core; the norm/layer hooks only park tensors for it.

Decode CUDA graphs (one-pass capture, :mod:`hs_dataset.server_patch.graph_capture`): where
the launcher registered these hooks before the decode graphs were captured, the norm and
layer hooks, run while a graph is captured, copy their states into static buffers
(:mod:`.graph_buffers`) instead, so every replay writes them; the model hook does nothing
more then (its Python never replays), and :meth:`_Runtime.on_graph_replay`, called after
each replay, hands the replayed rows to the core. The status fact ``decode_capture``
(:mod:`.contract.decode_capture`) says which case holds; one-pass requests are refused
where decode steps escape the hooks.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

import torch

from hs_dataset.server_patch import compat, decode_route
from hs_dataset.server_patch.batch import DECODE_MODE, PREFILL_MODES, BatchView
from hs_dataset.server_patch.config import CaptureConfig
from hs_dataset.server_patch.contract import decode_capture
from hs_dataset.server_patch.contract.mechanism import Mechanism
from hs_dataset.server_patch.core import CaptureCore
from hs_dataset.server_patch.graph_buffers import GraphBuffers
from hs_dataset.server_patch.mechanisms import check_server_args, server_mechanism
from hs_dataset.server_patch.mechanisms.base import PassCapture
from hs_dataset.server_patch.mechanisms.layer_hooks import check_layer_outputs
from hs_dataset.server_patch.setup_error import SetupError
from hs_dataset.server_patch.states import prepare_quantizer

__all__ = ["SetupError", "get_runtime", "layer_hook", "model_hook", "norm_hook", "route_runtime"]

logger = logging.getLogger("hs_dataset.server_patch")

_RUNTIME: _Runtime | None = None
_RUNTIME_LOCK = threading.Lock()

ALLOW_PREFILL_GRAPH_ENV = "HS_CAPTURE_ALLOW_PREFILL_GRAPH"  # "1": start even with a prefill CUDA graph on (diagnostics only)
NO_ROUTE = (
    "decode CUDA graphs are on and the hooks were registered after their capture, so no hook runs on a replayed decode "
    "step: start the server through `python -m hs_dataset.server_patch.launch` (hs-dataset serve does) or with --disable-cuda-graph"
)


def _capturing() -> bool:
    """Whether a CUDA graph is being captured on this thread's stream (False where torch has no CUDA)."""
    try:
        return bool(torch.cuda.is_current_stream_capturing())
    except (RuntimeError, AssertionError):
        return False


def _decode_capture_fact(args: Any) -> str:
    """The ``decode_capture`` fact as known when the hooks are made (the route confirms or withdraws ``graph`` after capture)."""
    if compat.decode_cuda_graph(args) != "on":
        return decode_capture.EAGER
    route = decode_route.ROUTE
    if route.early:
        return decode_capture.GRAPH
    return decode_capture.off(route.reason or NO_ROUTE)


class _Runtime:
    """Per-process state shared by the hooks of one server."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.raw_config = {k: v for k, v in dict(config).items() if k != "hook_hf_id"}
        self.config = CaptureConfig.from_sources(self.raw_config)
        self.mechanism = server_mechanism(self.config.mechanism)
        self.version = compat.sglang_version()
        args = compat.server_args()
        self.facts = {
            "forward_batch_rids": compat.forward_batch_rids(),
            "prefill_cuda_graph": compat.prefill_cuda_graph(args),
            decode_capture.DECODE_CAPTURE: _decode_capture_fact(args),
        }
        # the static rows decode graphs write, where the hooks are registered before those graphs are captured
        self.graph = GraphBuffers(len(self.config.hf_aux_layer_ids), self.config.state_encoding) if decode_route.ROUTE.early else None
        problems = check_server_args(args, self.config.mechanism)
        if self.facts["prefill_cuda_graph"] == "on" and os.environ.get(ALLOW_PREFILL_GRAPH_ENV) != "1":
            problems.append(
                "the prefill runs in a CUDA graph, which replays the model without running the capture hooks; start the "
                "server with --disable-prefill-cuda-graph (hs-dataset serve passes it; decode graphs stay on)"
            )
        if problems:
            raise SetupError(
                "hs_dataset capture cannot produce complete hidden states with this server set-up: "
                + "; ".join(problems)
                + ". Start the server without these options (hs-dataset serve does)."
            )
        self._writes: bool | None = None
        self.core: CaptureCore | None = None
        self.pending_final: torch.Tensor | None = None
        self.pending_aux: torch.Tensor | None = None  # [N, K, H] the layer hooks of this pass write into
        self.pending_layers: set[int] = set()  # HF ids written into it in this pass
        self.aux_slot = {hf: k for k, hf in enumerate(self.config.hf_aux_layer_ids)}
        self.layer_problem: str | None = None
        self._errors = 0
        logger.info(
            "hs_dataset capture: hooks loaded (sglang %s, mechanism %s, HF aux ids %s, staging %s)",
            self.version,
            self.config.mechanism,
            list(self.config.hf_aux_layer_ids),
            self.config.staging_dir,
        )
        try:
            self.writes()  # now, so the status file is there before the first request (the client reads its facts)
        except Exception:  # pragma: no cover -- parallel state not ready: decided at the first pass instead
            self._writes = None

    def writes(self) -> bool:
        if self._writes is None:
            tp, dp, source = compat.attention_ranks()
            self._writes = tp == 0
            if self._writes:
                self.core = CaptureCore(
                    self.config,
                    sglang_version=self.version,
                    extra_metadata={"attn_dp_rank": str(dp)},
                    status_writer=f"dp{dp}",
                    facts=self.facts,
                )
                self.core.one_pass_refusal = decode_capture.one_pass_refusal(self.facts[decode_capture.DECODE_CAPTURE])
                if str(getattr(compat.server_args(), "device", "")).startswith("cuda"):
                    took = self.core.copier.prepare_pinned()
                    logger.info("hs_dataset capture: pinned %d bytes for device copies in %.1f s", self.config.pinned_pool_bytes, took)
                    took = prepare_quantizer(self.config.state_encoding, torch.device("cuda", torch.cuda.current_device()))
                    logger.info("hs_dataset capture: %s quantizer ready in %.1f s", self.config.state_encoding or "no", took)
            logger.info(
                "hs_dataset capture: attention-TP rank %d, DP rank %d (%s): %s",
                tp,
                dp,
                source,
                "this rank writes dumps" if self._writes else "not writing (another rank of this group does)",
            )
        return self._writes

    # hooks ------------------------------------------------------------------

    def on_norm(self, inputs, output) -> None:
        if isinstance(output, (tuple, list)) and len(output) >= 2 and isinstance(output[1], torch.Tensor):
            prenorm = output[1]  # the residual sum the norm consumed: pre-norm
        elif isinstance(output, torch.Tensor) and inputs and isinstance(inputs[0], torch.Tensor):
            prenorm = inputs[0]  # norm(hidden) without residual: its input is complete
        else:
            prenorm = None
        if self.graph is not None and _capturing():
            if prenorm is not None:
                self.graph.keep_final(prenorm)  # recorded into the graph: every replay writes the static rows
            return
        self.pending_final = prenorm

    def on_layer(self, hf_id: int, output) -> None:
        hidden = output[0] if isinstance(output, (tuple, list)) else output
        if not isinstance(hidden, torch.Tensor):
            # 0.5.23 under TP: an OwedOutput, the rank's partial sum reduced only at the next layer
            self.layer_problem = (
                f"decoder layer output for HF hidden_states {hf_id} is of type {type(hidden).__name__}, not a complete "
                "tensor (under tensor parallelism: an un-reduced partial sum); use mechanism 'aux_return'"
            )
            if self.graph is not None and _capturing():
                self.graph.fail(self.layer_problem)
            return
        residual = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
        residual = residual if isinstance(residual, torch.Tensor) else None
        if self.graph is not None and _capturing():
            self.graph.keep_layer(self.aux_slot[hf_id], hidden, residual)
            return
        slot = self._aux_buffer(hidden, residual)[:, self.aux_slot[hf_id]]
        if residual is not None:
            torch.add(hidden, residual, out=slot)
        else:
            slot.copy_(hidden)
        self.pending_layers.add(hf_id)

    def _aux_buffer(self, hidden: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """The pass's ``[N, K, H]`` aux states, made by its first layer hook.

        Why one buffer: each layer's sum lands in the layout the dump stores, so the pass
        needs no stack, and the core copies its rows to the host without a device
        snapshot first (nothing but these hooks writes the buffer).
        """
        dtype = torch.result_type(hidden, residual) if residual is not None else hidden.dtype
        shape = (hidden.shape[0], len(self.aux_slot), hidden.shape[-1])
        buf = self.pending_aux
        if buf is None or tuple(buf.shape) != shape or buf.dtype != dtype or buf.device != hidden.device:
            buf = self.pending_aux = torch.empty(shape, dtype=dtype, device=hidden.device)
            self.pending_layers = set()
        return buf

    def _take_pass(self) -> PassCapture:
        """What the norm and layer hooks parked in this pass, cleared for the next one."""
        taken = PassCapture(self.pending_final, self.pending_aux, self.pending_layers, self.layer_problem)
        self.pending_final, self.pending_aux, self.pending_layers, self.layer_problem = None, None, set(), None
        return taken

    def on_model(self, inputs, output) -> None:
        taken = self._take_pass()
        if self.graph is not None and _capturing():
            self._graph_captured(inputs)
            return
        final = taken.final
        fb = next((x for x in inputs if hasattr(x, "forward_mode") and hasattr(x, "batch_size")), None)
        if fb is None:
            return
        mode = getattr(fb.forward_mode, "name", None)
        if (mode not in PREFILL_MODES and mode != DECODE_MODE) or not self.writes():
            return
        ids = inputs[0] if inputs and isinstance(inputs[0], torch.Tensor) else None
        batch = BatchView.from_forward_batch(fb, input_ids=ids)
        aux, missing = self._aux_states(output, taken)
        if final is None and missing is None:
            missing = (
                "the final-norm hook did not fire in this pass (prefill CUDA graph replay or a norm fused into an "
                "all-reduce): pass --disable-prefill-cuda-graph and leave all-reduce fusion off"
            )
        owned = aux is taken.packed or not self.aux_slot  # the hooks' own buffer: the core need not snapshot it
        self.core.process(batch, aux=aux, final_prenorm=final, missing_reason=missing, aux_owned=owned)

    # decode CUDA graphs ------------------------------------------------------

    def _graph_captured(self, inputs) -> None:
        """The model hook at the end of one graph's capture: the rows' packing recorded (the replays are read instead).

        ``inputs``: the model's arguments, ``(input_ids, positions, forward_batch, ...)`` in
        every release with this route (the graph's static inputs while it is captured).
        """
        if self.aux_slot and not self.mechanism.takes_layer_hooks:
            self.graph.fail(f"mechanism {self.config.mechanism} returns the aux states from the model, not into the static rows")
        self.graph.captured()
        input_ids, positions = (tuple(inputs) + (None, None))[:2]
        self.graph.keep_record(input_ids, positions)

    def graphs_captured(self, captured: bool) -> None:
        """After SGLang captured its graphs with these hooks on (the route calls it): the fact, confirmed or withdrawn.

        ``captured``: a decode graph runner was made. Without one every decode step runs
        eagerly through the hooks (``eager``); with one, the hooks must have recorded every
        capture whole, else one-pass requests are refused with why.
        """
        graph = self.graph
        if not captured:
            fact = decode_capture.EAGER
        elif graph is None or graph.captures == 0:
            fact = decode_capture.off("decode graphs were captured, but the hooks saw no capture (registered too late)")
        elif graph.problem is not None:
            fact = decode_capture.off(graph.problem)
        else:
            fact = decode_capture.GRAPH
        self.set_decode_capture(fact)
        logger.info(
            "hs_dataset capture: decode_capture %s (%d decode graphs recorded the states into %d static rows)",
            fact,
            graph.captures if graph else 0,
            graph.rows if graph else 0,
        )

    def set_decode_capture(self, fact: str) -> None:
        """Record the ``decode_capture`` fact, in the status file too, and refuse one-pass requests where it says so."""
        self.facts[decode_capture.DECODE_CAPTURE] = fact
        if self.core is not None:
            self.core.one_pass_refusal = decode_capture.one_pass_refusal(fact)
            self.core.reporter.fact(decode_capture.DECODE_CAPTURE, fact)

    def on_graph_replay(self, fb) -> None:
        """A decode graph was replayed for ``fb``: its first ``batch_size`` record rows are the step's rows.

        The rows follow ``fb.rids`` (the real batch; the graph's padding rows are past them),
        each with its own token id and position. They are a view the next replay
        overwrites: the core copies them before anything later on the stream writes them.
        """
        graph = self.graph
        if graph is None or getattr(fb.forward_mode, "name", None) != DECODE_MODE or not self.writes():
            return
        rows = int(fb.batch_size)
        batch = BatchView.from_forward_batch(fb)
        batch.rids = batch.rids[:rows] if batch.rids is not None else None  # (ids and positions: the record's own)
        self.core.stats["graph_decode_passes"] += 1
        self.core.stats["graph_decode_rows"] += rows
        if graph.problem is not None or rows > graph.rows:
            reason = graph.problem or f"a replayed decode batch of {rows} rows is larger than the static buffer ({graph.rows})"
            self.core.process(batch, aux=None, final_prenorm=None, missing_reason=reason)
            return
        record, layout = graph.replayed(rows)
        self.core.process_record(batch, record, layout, graph.state_dtype)

    def _aux_states(self, output, taken: PassCapture) -> tuple[Any, str | None]:
        """(aux states, why there are none) of the pass, as the mechanism obtains them.

        With no aux layer (an MTP capture, the final state only) none is asked for and none is
        returned: an empty ``[T, 0, H]`` beside the final state.
        """
        if self.aux_slot:
            return self.mechanism.aux_states(output, taken, self.config.hf_aux_layer_ids)
        final = taken.final
        return (final.new_empty((final.shape[0], 0, final.shape[-1])) if final is not None else None), None

    def guard(self, fn, *args) -> int:
        """Run one hook; a failure is counted and logged, never raised into SGLang. Returns its wall time (ns)."""
        started = time.perf_counter_ns()
        try:
            fn(*args)
        except Exception as exc:
            self._errors += 1
            if self.graph is not None and _capturing():
                self.graph.fail(f"a capture hook failed while a decode graph was captured: {type(exc).__name__}: {exc}")
            if self.core is not None:
                self.core.hook_failed(f"{type(exc).__name__}: {exc}")
            if self._errors <= 10:
                logger.exception("hs_dataset capture: hook failed (the forward pass goes on; affected requests get no dump)")
        finally:
            elapsed = time.perf_counter_ns() - started
            if self.core is not None:  # what the hooks cost the forward thread, in the status file (hook_wall_ns)
                self.core.stats["hook_wall_ns"] += elapsed
        return elapsed


def get_runtime(config: Mapping[str, Any]) -> _Runtime:
    """The process's runtime, created by the first factory call; later calls must carry the same config."""
    global _RUNTIME
    with _RUNTIME_LOCK:
        cleaned = {k: v for k, v in dict(config or {}).items() if k != "hook_hf_id"}
        if _RUNTIME is None:
            _RUNTIME = _Runtime(cleaned)
        elif cleaned != _RUNTIME.raw_config:
            raise SetupError(
                "hs_dataset capture: the forward-hook specs of one server carry different configs; "
                "give every hs_dataset hook spec the same config"
            )
        return _RUNTIME


def route_runtime() -> _Runtime | None:
    """This process's runtime, if a hook factory made one (the decode-graph route reports to it)."""
    return _RUNTIME


def model_hook(config: Mapping[str, Any]):
    """Factory for the hook on the decoder stack (``model`` / ``language_model.model``)."""
    rt = get_runtime(config)

    def hs_capture_model_hook(module, inputs, output):
        rt.guard(rt.on_model, inputs, output)

    return hs_capture_model_hook


def norm_hook(config: Mapping[str, Any]):
    """Factory for the hook on the final norm (``model.norm``): parks the pre-norm final state."""
    rt = get_runtime(config)

    def hs_capture_norm_hook(module, inputs, output):
        rt.guard(rt.on_norm, inputs, output)

    return hs_capture_norm_hook


def layer_hook(config: Mapping[str, Any]):
    """Factory for one aux layer (``layer_hooks`` mechanism); ``config["hook_hf_id"]`` names the HF index."""
    if "hook_hf_id" not in (config or {}):
        raise SetupError("hs_dataset layer_hook needs config['hook_hf_id'] (the HF hidden_states index it records)")
    hf_id = int(config["hook_hf_id"])
    rt = get_runtime(config)
    if not rt.mechanism.takes_layer_hooks:
        raise SetupError(f"hs_dataset layer_hook is only used with mechanism '{Mechanism.LAYER_HOOKS}'")
    check_layer_outputs(rt.config.architectures)

    def hs_capture_layer_hook(module, inputs, output):
        rt.guard(rt.on_layer, hf_id, output)

    return hs_capture_layer_hook

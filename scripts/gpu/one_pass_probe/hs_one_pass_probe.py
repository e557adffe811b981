"""Route finding for one-pass capture (issue 45): can decode-step states be captured inside SGLang's decode CUDA graphs?

Started instead of ``python -m sglang.launch_server`` (same arguments) through
``python -c "import hs_one_pass_probe as p; p.main()" ARGS``. It hands SGLang's own ``launch_server`` a
scheduler entry point of ours (``run_scheduler_process_func``, an argument SGLang offers for private forks), so
every scheduler process, spawned or not, first wraps two methods in memory, no file edited:

* ``ModelRunner.init_cuda_graphs``: before the graphs are captured, forward hooks go on the aux layers and the
  final norm. Each copies its state into one static device buffer ``[rows, K + 1, H]``; run during graph capture,
  those copies are recorded into every decode graph, so each replay writes the states of its batch there.
* ``DecodeCudaGraphRunner.execute``: after each replay, the buffer's first ``batch_size`` rows are this batch's
  states, in the order of ``forward_batch.rids``, at ``forward_batch.positions``.

Eager passes (prefill, or a decode batch no graph covers) run the hooks in Python and are read by a hook on the
decoder stack. Every pass is saved as one file ``{pid}-{n}.pt`` (rids, positions, mode, states) in
``HS_PROBE_OUT``; the driver (``scripts/gpu/one_pass_probe.py``) compares them with a prefill of the stored
sequence. A probe, not the product: synchronous host copies, no staging, no bounds.

Environment: HS_PROBE_OUT (folder), HS_PROBE_AUX (HF hidden_states ids, comma-separated), HS_PROBE_ROWS.
"""

from __future__ import annotations

import itertools
import os
import sys

import torch

_CAPTURE = None


class _Capture:
    """The static buffer, the hooks that fill it and the reader that saves each pass's rows."""

    def __init__(self, model: torch.nn.Module, aux: list[int], rows: int, out: str) -> None:
        stack = model.model
        hidden = stack.norm.weight.shape[0]
        device, dtype = stack.norm.weight.device, next(model.parameters()).dtype
        self.buf = torch.zeros(rows, len(aux) + 1, hidden, dtype=dtype, device=device)
        self.out, self.count, self.stats = out, itertools.count(), {"replay": 0, "eager": 0, "skipped": 0}
        for slot, hf_id in enumerate(aux):  # HF hidden_states[i] is the output of decoder layer i - 1
            stack.layers[hf_id - 1].register_forward_hook(self._layer_hook(slot))
        stack.norm.register_forward_hook(self._norm_hook)
        stack.register_forward_hook(self._stack_hook)

    def _layer_hook(self, slot: int):
        def hook(module, inputs, output):
            hidden, residual = output[0], output[1]
            rows = hidden.shape[0]
            if rows <= self.buf.shape[0]:
                torch.add(hidden, residual, out=self.buf[:rows, slot])

        return hook

    def _norm_hook(self, module, inputs, output) -> None:
        pre_norm = output[1] if isinstance(output, (tuple, list)) else inputs[0]
        rows = pre_norm.shape[0]
        if rows <= self.buf.shape[0]:
            self.buf[:rows, -1].copy_(pre_norm)

    def _stack_hook(self, module, inputs, output) -> None:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return  # recording a graph: the rows are read after each replay instead
        batch = next((x for x in inputs if hasattr(x, "forward_mode")), None)
        if batch is not None:
            self.save(batch, "eager")

    def save(self, batch, how: str) -> None:
        mode = batch.forward_mode.name
        rids = list(getattr(batch, "rids", None) or [])
        if mode == "DECODE":
            rows = int(batch.batch_size)
            lens = [1] * rows
        else:
            lens = [int(x) for x in (batch.extend_seq_lens_cpu or [])]
            rows = sum(lens)
        if not rids or rows == 0 or rows > self.buf.shape[0] or len(rids) != len(lens):
            self.stats["skipped"] += 1
            return
        self.stats[how] += 1
        record = {
            "mode": mode,
            "how": how,
            "rids": rids,
            "lens": lens,
            "positions": batch.positions[:rows].to("cpu", torch.int64),
            "states": self.buf[:rows].to("cpu"),
            "stats": dict(self.stats),
        }
        torch.save(record, os.path.join(self.out, f"{os.getpid()}-{next(self.count):07d}.pt"))


def _install() -> None:
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    init_graphs, execute = ModelRunner.init_cuda_graphs, DecodeCudaGraphRunner.execute

    def init_cuda_graphs(self, *args, **kwargs):
        global _CAPTURE
        if not getattr(self, "is_draft_worker", False) and _CAPTURE is None:
            aux = [int(x) for x in os.environ["HS_PROBE_AUX"].split(",")]
            _CAPTURE = _Capture(self.model, aux, int(os.environ.get("HS_PROBE_ROWS", "8192")), os.environ["HS_PROBE_OUT"])
        return init_graphs(self, *args, **kwargs)

    def execute_and_read(self, forward_batch, *args, **kwargs):
        out = execute(self, forward_batch, *args, **kwargs)
        if _CAPTURE is not None and not getattr(self.model_runner, "is_draft_worker", False):
            _CAPTURE.save(forward_batch, "replay")
        return out

    ModelRunner.init_cuda_graphs = init_cuda_graphs
    DecodeCudaGraphRunner.execute = execute_and_read


def run_scheduler_process(*args, **kwargs):
    """SGLang's scheduler process, with the capture installed first (this runs in the spawned process)."""
    _install()
    from sglang.srt.managers.scheduler import run_scheduler_process as original

    return original(*args, **kwargs)


def main() -> None:
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import prepare_server_args

    launch_server(prepare_server_args(sys.argv[1:]), run_scheduler_process_func=run_scheduler_process)

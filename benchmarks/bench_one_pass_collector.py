"""CPU: what the server's one-pass collector costs per decode step, against copying the step's rows once; and the forward thread's part.

One-pass capture hands every decode step's rows of one-pass requests to the collector's
thread (``server_patch/one_pass.py``), which files each row under its request and, every
``piece_rows`` rows of a request, joins them into a piece for the dump writer. That thread
runs inside SGLang's scheduler process and shares its GIL, so its CPU per step is part of
what one pass may cost the server (issue 45: on the lent H100 the build's generation ran at
0.70 of a plain client's). This drives the real collector at the GPU run's shape (128
requests a step, Kimi width, 3 aux layers, bf16) from one thread, the pieces handed to a
writer that only counts them (the disk write is the writer threads' cost, not this one's),
and prints its CPU per step beside the CPU of one copy of the same bytes (the least any
collector that keeps the rows must spend), and the share spent in Python (the rest is
tensor copies, which let go of the GIL).

    python benchmarks/bench_one_pass_collector.py [--requests 128] [--steps 512]

It also prints the forward thread's part of a replayed decode step (the graph packed the rows) and what
locating a prefill pass's one-pass rows costs it.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hs_dataset.server_patch.budget import StagingBudget
from hs_dataset.server_patch.copier import HostPiece
from hs_dataset.server_patch.one_pass import PieceCollector, _Block
from hs_dataset.server_patch.row_record import RECORD, RecordLayout, packed, row_columns

# the profiler's names of the C calls that copy tensor bytes (they let go of the GIL)
TENSOR_OPS = ("'clone'", "torch.cat", "method cat", "'copy_'", "index_select", "index_copy_")


class CountingWriter:
    """Takes the collector's pieces and only counts them."""

    def __init__(self) -> None:
        self.pieces = 0

    def submit(self, job: object) -> None:
        self.pieces += 1


def step_rows(requests: int, hidden: int) -> dict[str, torch.Tensor]:
    return {
        "input_ids": torch.zeros(requests, dtype=torch.int64),
        "positions": torch.arange(requests, dtype=torch.int64),
        "aux": torch.randn(requests, 3, hidden).to(torch.bfloat16),
        "final": torch.randn(requests, hidden).to(torch.bfloat16),
    }


def step_record(requests: int, hidden: int) -> tuple[RecordLayout, torch.Tensor]:
    """A decode step's rows as the forward thread hands them over: one packed record a row."""
    return packed(step_rows(requests, hidden))


def collector_cpu(args: argparse.Namespace) -> tuple[float, float, int]:
    """(CPU ms a step, share of it in Python, pieces) of the collector filing ``args.steps`` decode steps."""
    writer = CountingWriter()
    collector = PieceCollector(
        budget=StagingBudget(1 << 50, 1 << 30, lambda: (0, 0)), writer=writer, stats={}, refuse=lambda rid, why: None,
        piece_rows=args.piece_rows, max_held_bytes=2 << 30, max_wait_s=1.0, start_thread=False,
    )  # fmt: skip
    columns, record = step_record(args.requests, args.hidden)
    owners = [(f"hs-bench-{i}-g100", i, 1) for i in range(args.requests)]

    def steps(n: int) -> None:
        for _ in range(n):
            collector._handle(_Block(HostPiece({RECORD: record}), owners, columns, "bfloat16"))

    steps(args.piece_rows)  # warm: every request holds rows, pieces go out from here on
    started = time.thread_time()
    steps(args.steps)
    cpu = (time.thread_time() - started) / args.steps
    profile = cProfile.Profile()
    profile.enable()
    steps(args.steps)
    profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in stats.values())
    copying = sum(v[2] for k, v in stats.items() if any(op in k[2] for op in TENSOR_OPS))
    return 1e3 * cpu, 1 - copying / total if total else 0.0, writer.pieces


def forward_cpu(args: argparse.Namespace, *, replayed: bool = False) -> float:
    """CPU ms a decode step of the forward thread's part for ``args.requests`` one-pass requests.

    ``replayed`` False: an eager step (``CaptureCore.process``: the rows packed, then copied); True: a step a decode
    graph replayed (``CaptureCore.process_record``: the graph packed the record; what is left is the plan, the
    block and the hand-over). Hidden size 64: on a CPU server the forward thread also copies the rows to the host,
    which on a GPU is a device copy; at this width that copy is negligible and what is left is the Python a GPU
    server's forward thread runs (the device copy's launch and event aside).
    """
    import tempfile

    from hs_dataset.server_patch.batch import BatchView
    from hs_dataset.server_patch.config import CaptureConfig
    from hs_dataset.server_patch.core import CaptureCore

    n, hidden = args.requests, 64
    with tempfile.TemporaryDirectory() as tmp:
        config = CaptureConfig.from_sources(
            {"staging_dir": f"{tmp}/stage", "hf_aux_layer_ids": [1, 2, 3], "max_wait_s": 1.0, "sweep_interval_s": 3600}, environ={}
        )
        core = CaptureCore(config, sglang_version="bench")
        rids = [f"hs-bench-{i}-g100" for i in range(n)]
        aux = [torch.randn(n, hidden).to(torch.bfloat16) for _ in range(3)]
        final, ids = torch.randn(n, hidden).to(torch.bfloat16), torch.zeros(n, dtype=torch.int64)

        columns, record = packed(row_columns(ids, torch.full((n,), 100), {"aux": torch.stack(aux, 1), "final": final}))

        def step(k: int) -> None:
            batch = BatchView(mode="DECODE", extend_seq_lens=None, rids=rids, input_ids=ids, positions=torch.full((n,), 100 + k))
            if replayed:
                core.process_record(batch, record, columns, "bfloat16")
            else:
                core.process(batch, aux=aux, final_prenorm=final)

        for k in range(50):
            step(k)
        started = time.thread_time()
        for k in range(args.steps):
            step(50 + k)
        cpu = (time.thread_time() - started) / args.steps
        core.flush(60)
        core.close()
    return 1e3 * cpu


def locate_ms(rows: int = 8192, gap: int = 0, calls: int = 200) -> float:
    """ms to locate the one-pass rows of a prefill pass of two requests (``rows`` in all; ``gap`` rows between them,
    another request's, so the block is gathered) on the forward thread: ``_BlockLayout.of``."""
    from hs_dataset.server_patch.batch import RequestSlice
    from hs_dataset.server_patch.core import _BlockLayout

    half = rows // 2
    slices = [RequestSlice("a", 0, half, 0, True), RequestSlice("b", half + gap, rows - half, 0, True)]
    started = time.perf_counter()
    for _ in range(calls):
        _BlockLayout.of(slices, torch.device("cpu"))
    return 1e3 * (time.perf_counter() - started) / calls


def copy_cpu(args: argparse.Namespace) -> float:
    """CPU ms of one copy of a step's rows into memory already touched (the baseline)."""
    rows = step_rows(args.requests, args.hidden)
    dest = {k: torch.empty_like(t) for k, t in rows.items()}
    for k in rows:
        dest[k].copy_(rows[k])
    started = time.thread_time()
    for _ in range(args.steps):
        for k, t in rows.items():
            dest[k].copy_(t)
    return 1e3 * (time.thread_time() - started) / args.steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=128, help="one-pass requests in each decode step")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--piece-rows", type=int, default=256, help="the server's one_pass_piece_rows")
    ap.add_argument("--steps", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    step_mb = args.requests * (3 + 1) * args.hidden * 2 / 1e6
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; {args.requests} requests a step, hidden {args.hidden}, 3 aux layers, "
        f"bf16 ({step_mb:.1f} MB of states a step), pieces of {args.piece_rows} rows; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    best_collector = best_copy = best_forward = best_replayed = float("inf")
    for r in range(args.rounds):
        ms, python_share, pieces = collector_cpu(args)
        base = copy_cpu(args)
        best_collector, best_copy = min(best_collector, ms), min(best_copy, base)
        forward, replayed = forward_cpu(args), forward_cpu(args, replayed=True)
        best_forward, best_replayed = min(best_forward, forward), min(best_replayed, replayed)
        print(
            f"round {r + 1}: collector {ms:.2f} ms CPU a step ({100 * python_share:.0f}% of it in Python, profiled), "
            f"{pieces} pieces; one copy of the step's rows {base:.2f} ms; the forward thread's part {forward:.2f} ms "
            f"(a replayed step's {replayed:.3f} ms)",
            flush=True,
        )
    print(
        f"locating a prefill pass's one-pass rows (8,192): {locate_ms():.3f} ms one run, {locate_ms(gap=100):.3f} ms gathered", flush=True
    )
    print(
        f"best of {args.rounds}: collector {best_collector:.2f} ms a step, {best_collector / best_copy:.1f}x one copy ({best_copy:.2f} ms); "
        f"the forward thread's part {best_forward:.2f} ms a step, a replayed step's {best_replayed:.3f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

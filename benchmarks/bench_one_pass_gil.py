"""CPU: how much one-pass capture's threads lengthen a GIL-bound scheduler loop's step (issue 45's hypothesis).

On the lent H100 the build's decode step ran at 0.56 of a plain server's (64 against 114 tokens
a second per request) with one-pass capture on. SGLang's scheduler is one Python thread whose
step is CPU-bound at 128 running requests (its own Python between many small torch calls, each
of which lets go of the GIL), and capture's threads (the one-pass collector, the dump writers)
run in the same process. A thread that lets go of the GIL for a torch call has to wait for it
again while another thread runs Python: each of the scheduler's hundreds of calls a step can
wait for a slice of capture's Python.

This drives a stand-in for that loop on the main thread -- ``--ops`` small torch calls with a
little Python between them, then ``--gpu-ms`` of waiting without the GIL (the step's GPU work)
-- and, each step, hands capture what the real forward thread hands it on a GPU server after the
device copy (the step's rows of ``--requests`` one-pass requests as host tensors, the decode
step's rids): the real :class:`~hs_dataset.server_patch.core.CaptureCore` (collector and dump
writers, pieces written to a staging dir in ``--staging``, deleted as they come as the client
would). Printed: the loop's CPU-side step time with capture and without it, measured
alternately in the same run, and capture's threads' CPU per step.

    python benchmarks/bench_one_pass_gil.py [--requests 128] [--steps 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_one_pass_collector import step_rows  # a decode step's rows: the collector bench's

from hs_dataset.server_patch.config import CaptureConfig
from hs_dataset.server_patch.copier import HostPiece
from hs_dataset.server_patch.core import CaptureCore
from hs_dataset.server_patch.row_record import RECORD, packed


def scheduler_step(ops: int, work: list[torch.Tensor], python_items: int) -> None:
    """The stand-in for the scheduler's CPU side: ``ops`` small torch calls, each after a little Python."""
    acc = 0
    for i in range(ops):
        acc += sum(range(python_items))  # the scheduler's bookkeeping between calls
        work[i % len(work)].add_(1)  # a torch call: lets go of the GIL and takes it back


class Drain(threading.Thread):
    """Deletes the pieces as they appear (the client's part), so staging never fills."""

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.root, self.stop = root, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                for path in self.root.rglob("*.safetensors"):
                    path.unlink(missing_ok=True)
            except OSError:  # a file renamed or removed while listed: the next listing takes it
                continue


def run_loop(args: argparse.Namespace, core: CaptureCore | None, rows: dict[str, torch.Tensor]) -> list[float]:
    """CPU-side wall of each step (ms), capture fed each step where ``core`` is given."""
    work = [torch.zeros(4) for _ in range(8)]
    rids = [f"hs-bench-{i}-g100" for i in range(args.requests)]
    owners = [(rid, i, 1) for i, rid in enumerate(rids)]
    columns, record = packed(rows)
    times = []
    for _ in range(args.steps):
        started = time.perf_counter()
        scheduler_step(args.ops, work, args.python_items)
        if core is not None:
            core.collector.decode_step(rids)
            core.collector.take(HostPiece({RECORD: record}), owners, columns, "bfloat16")
        times.append(1e3 * (time.perf_counter() - started))
        time.sleep(args.gpu_ms / 1e3)
    return times


def capture_threads_cpu() -> float:
    """CPU seconds of this process's threads other than the main one (capture's collector and writers, and the drain)."""
    total = 0.0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == threading.main_thread().native_id:
            continue
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ops", type=int, default=1500, help="torch calls in the stand-in scheduler's step")
    ap.add_argument("--python-items", type=int, default=40, help="Python between two of them (sum over a range this long)")
    ap.add_argument("--gpu-ms", type=float, default=4.0, help="the step's wait without the GIL")
    ap.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval for the run (s; Python's default 0.005)")
    ap.add_argument("--staging", type=Path, default=Path("/dev/shm") if Path("/dev/shm").is_dir() else None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    root = Path(tempfile.mkdtemp(prefix="hs-gil-", dir=args.staging))
    rows = step_rows(args.requests, args.hidden)
    cfg = CaptureConfig.from_sources(
        {"staging_dir": str(root / "stage"), "hf_aux_layer_ids": [1, 2, 3], "max_wait_s": 5.0, "sweep_interval_s": 3600,
         "max_staging_bytes": 8 << 30},
        environ={},
    )  # fmt: skip
    core = CaptureCore(cfg, sglang_version="bench")
    drain = Drain(root / "stage")
    drain.start()
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; stand-in step: {args.ops} torch calls, {args.gpu_ms} ms without the GIL; "
        f"{args.requests} one-pass requests, hidden {args.hidden}, bf16, pieces of {cfg.one_pass_piece_rows} rows, "
        f"{cfg.writer_threads} writers; switch interval {sys.getswitchinterval() * 1e3:g} ms; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    best = float("inf")
    try:
        run_loop(args, None, rows)  # warm
        for r in range(args.rounds):
            plain_steps = run_loop(args, None, rows)
            cpu0 = capture_threads_cpu()
            capture_steps = run_loop(args, core, rows)
            plain, with_capture = statistics.fmean(plain_steps), statistics.fmean(capture_steps)
            medians = statistics.median(capture_steps) / statistics.median(plain_steps)
            p99 = sorted(capture_steps)[int(0.99 * len(capture_steps))]
            core.flush(60)
            threads_ms = 1e3 * (capture_threads_cpu() - cpu0) / args.steps
            best = min(best, with_capture / plain)
            print(
                f"round {r + 1}: step {with_capture:.2f} ms with capture, {plain:.2f} ms without (means): {with_capture / plain:.2f}x "
                f"(medians {medians:.2f}x; p99 with capture {p99:.1f} ms); "
                f"capture's threads {threads_ms:.2f} ms CPU a step; pieces {core.stats['one_pass_pieces']}",
                flush=True,
            )
    finally:
        core.close()
        drain.stop.set()
        shutil.rmtree(root, ignore_errors=True)
    print(f"best of {args.rounds}: the step takes {best:.2f}x as long with one-pass capture's threads running")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""On a GPU host: where one-pass capture's cost on generation goes (the build server alone, no plain server).

Against the build's server (``hs-dataset serve``, started by ``run_one_pass_profile.sh``): the same regeneration
build as ``benchmarks/bench_regenerate.py``, with capture left out and with one-pass capture, alternated; during
one of the one-pass builds ``py-spy`` (if given) samples the scheduler process, every thread, and once more only
the thread holding the GIL, reduced by ``benchmarks/_spy_summary.py`` (who held the GIL, the scheduler thread's share in
capture's code; ``spy-summary.json``). Printed: each build's wall and generation rate, how its samples were captured, the
hooks' counters from the status file (forward-thread time per decode step, pieces, held bytes).

    python scripts/gpu/one_pass_profile.py --server URL --config CARD --model-path DIR --out DIR [--py-spy BIN]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_regenerate as br  # noqa: E402
from _capture_counters import capture_counters  # noqa: E402
from _regen_clients import Span  # noqa: E402


def scheduler_pid() -> int | None:
    """SGLang's scheduler process (its process title), else the GPU's compute process."""
    for cmd in (["pgrep", "-f", "sglang::scheduler"], ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"]):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True).stdout
        except OSError:
            continue
        pids = [int(p) for p in out.split() if p.strip().isdigit()]
        if pids:
            return pids[0]
    return None


def spy(binary: str, pid: int, out: Path, delay: float, seconds: int) -> threading.Thread:
    """py-spy on ``pid`` after ``delay`` s: all threads, then only the GIL holder (raw collapsed stacks)."""

    def run() -> None:
        time.sleep(delay)
        for name, extra in (("threads", ["--threads", "--idle"]), ("gil", ["--gil"])):
            cmd = [binary, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", "200", "--nonblocking"]
            cmd += [*extra, "--format", "raw", "-o", str(out / f"spy-{name}.txt")]
            done = subprocess.run(cmd, capture_output=True, text=True)
            print(f"py-spy {name}: rc {done.returncode} {done.stderr.strip()[-300:]}", flush=True)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


class Sampler:
    """This process's threads sampled every ``interval`` s (their innermost frames), for the client's side of the cost."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.counts: dict[tuple[str, str], int] = {}
        self._ticks = {"all": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        names = {}
        me = threading.get_ident()
        while not self._stop.wait(self.interval):
            self._ticks["all"] += 1
            if len(names) != threading.active_count():
                names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                where, f = [], frame
                while f is not None and len(where) < 3:
                    where.append(f"{Path(f.f_code.co_filename).name}:{f.f_code.co_name}:{f.f_lineno}")
                    f = f.f_back
                key = (names.get(ident, str(ident)).split(" ")[0][:24], " < ".join(where))
                self.counts[key] = self.counts.get(key, 0) + 1

    IDLE = ("selectors.py:select:", "thread.py:_worker:", "threading.py:wait:", "queue.py:get:", "template_guard.py:_run:")

    def report(self, top: int = 25) -> str:
        """Busy samples (a thread waiting in select, a queue, an event or a sleep is left out), by thread and by place."""
        busy = {k: n for k, n in self.counts.items() if not k[1].startswith(self.IDLE)}
        ticks = max((n for n in self._ticks.values()), default=1)
        by_thread: dict[str, int] = {}
        for (thread, _), n in busy.items():
            by_thread[thread] = by_thread.get(thread, 0) + n
        shares = {t: round(n / ticks, 2) for t, n in sorted(by_thread.items(), key=lambda kv: -kv[1])}
        lines = [f"client threads busy (share of the samples, {ticks} ticks): {json.dumps(shares)}"]
        for (thread, where), n in sorted(busy.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"  {100 * n / ticks:5.1f}% {thread:24s} {where}")
        return "\n".join(lines)


def torch_profile(server: str, trace_dir: Path, delay: float, steps: int) -> threading.Thread:
    """SGLang's torch profiler (CPU and GPU) on for ``steps`` forward passes, ``delay`` s into a build (steady decode).

    Why: whether a decode step's GPU sits idle waiting for the scheduler's CPU (capture's Python on the forward
    thread, the GIL) or runs longer kernels (capture's device work) shows in the trace, not in py-spy.
    """
    import urllib.request

    body = json.dumps({"output_dir": str(trace_dir), "num_steps": steps, "activities": ["CPU", "GPU"], "with_stack": False})

    def run() -> None:
        time.sleep(delay)
        trace_dir.mkdir(parents=True, exist_ok=True)
        request = urllib.request.Request(server + "/start_profile", data=body.encode(), headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=300).read()  # returns once the profile is written
        except OSError as exc:
            print(f"torch profile: {type(exc).__name__}: {exc}", flush=True)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def spy_report(out: Path) -> None:
    """Who held the scheduler process's GIL and what its scheduler thread ran (benchmarks/_spy_summary.py)."""
    from _spy_summary import summarize

    summary = summarize(out / "spy-gil.txt", out / "spy-threads.txt")
    (out / "spy-summary.json").write_text(json.dumps(summary, indent=1))
    print(f"py-spy summary: {json.dumps(summary)}", flush=True)


def trace_report(trace_dir: Path, out: Path, name: str) -> None:
    """The trace reduced to where the steps' time went (``benchmarks/_trace_summary.py``), printed and kept in ``out``."""
    from _trace_summary import summarize_trace

    traces = sorted(trace_dir.rglob("*.json*"))
    summary = summarize_trace(traces[0]) if traces else {"error": f"no trace written in {trace_dir}"}
    (out / f"trace-{name}.json").write_text(json.dumps(summary, indent=1))
    short = {k: summary.get(k) for k in ("window_ms", "kernel_busy_ms", "gpu_idle_share", "error") if k in summary}
    print(f"torch profile {name}: {json.dumps(short)}; top runtime {json.dumps(summary.get('runtime', [])[:5])}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--out", type=Path, required=True, help="where the py-spy profiles go")
    ap.add_argument("--work", type=Path, default=Path("/tmp/hs-one-pass-profile/work"), help="the builds' datasets (removed at the end)")
    ap.add_argument("--py-spy", default=None)
    ap.add_argument("--conversations", type=int, default=256)
    ap.add_argument("--mean-tokens", type=float, default=500)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--torch-profile-steps", type=int, default=0, help="SGLang's torch profile of this many steps of each round-1 build")
    ap.add_argument("--only-one-pass", action="store_true", help="no build with capture left out (an A/B's second server)")
    ap.add_argument("--no-reference", action="store_true", help="no warm-up build first (an A/B's second server, to save time)")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from hs_dataset.config import load_card

    card = load_card(args.config).with_overrides(model={"path": args.model_path})
    card = card.with_overrides(
        regenerate={"enabled": True, "max_new_tokens": int(6 * args.mean_tokens), "thinking": "off", "concurrency": None}
    )
    rows, _ = br.conversations(args.conversations, args.mean_tokens, 1.2, int(6 * args.mean_tokens), 0, 0.4)
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    source = work / "chats.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokenizer = AutoTokenizer.from_pretrained(args.model_path, local_files_only=True)
    span = Span()
    generator = br.drawn_lengths(tokenizer, span)
    staging = card.sglang.staging.dir
    if not args.no_reference:
        seconds, _ = br.run_build(card, source, work / "reference", args.server, generator)
        print(f"reference build (warm-up): {seconds:.1f} s, captured by {br.captured_by(work / 'reference')}", flush=True)
    pid = scheduler_pid()
    for r in range(args.rounds):
        for name in ("one_pass",) if args.only_one_pass else ("isolated", "one_pass"):
            span.__init__()
            before = capture_counters(staging)
            watcher = spy(args.py_spy, pid, args.out, 12, 10) if args.py_spy and pid and r == 0 and name == "one_pass" else None
            trace_dir = work / f"trace-{name}"
            profiler = torch_profile(args.server, trace_dir, 8, args.torch_profile_steps) if args.torch_profile_steps and r == 0 else None
            print(f"round {r + 1} {name} starts at {time.strftime('%H:%M:%S')}", flush=True)  # to find it in decode-log.txt
            with Sampler() as sampler:
                seconds, _ = br.run_build(card, source, work / name, args.server, generator, capture=name == "one_pass")
            after = capture_counters(staging)
            delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            how = br.captured_by(work / name) if name == "one_pass" else "nothing (capture left out)"
            steps = delta.get("decode_passes", 0)
            per_step = delta.get("hook_wall_ns", 0) / max(steps, 1) / 1e6
            print(
                f"round {r + 1} {name:9s} {seconds:6.1f} s; generation {span.seconds():6.1f} s, {span.rate():7.1f} tok/s, "
                f"{span.mean_in_flight():.1f} in flight ({span.at_server()}); captured by {how}; hooks {per_step:.3f} ms of forward thread per decode step "
                f"over {steps} steps; {json.dumps(delta, sort_keys=True)}",
                flush=True,
            )
            if r == 0:
                print(sampler.report(), flush=True)
            if watcher:
                watcher.join(60)
                spy_report(args.out)
            if profiler:
                profiler.join(120)
                trace_report(trace_dir, args.out, name)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

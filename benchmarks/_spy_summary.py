"""py-spy's raw stacks of SGLang's scheduler process reduced to what capture takes from it: a few shares, not 2 MB.

``scripts/gpu/one_pass_profile.py`` records two profiles of the scheduler process during a one-pass build:
every thread (``--threads --idle``) and only the thread holding the GIL (``--gil``). On an overlap scheduler
whose decode step is bound by its CPU, the step grows by the scheduler thread's own time in capture's hooks
and by the time capture's threads hold the GIL it waits for. This module says both:

* ``gil``: of the samples where some thread held the GIL, the share of each holder: the scheduler thread in
  SGLang's code or in capture's hooks, each of capture's threads (by its loop), anything else;
* ``scheduler``: of the scheduler thread's samples, the share inside capture's own code (a sample belongs
  to the innermost frame that is neither the standard library nor a named third-party library, so SGLang's
  graph replay called from capture's replay wrapper counts as SGLang's, and a torch copy called from capture as
  capture's).

Raw format (``py-spy record --format raw``): one line per distinct stack, ``frame;frame;...;frame count``,
outermost frame first, each frame ``function (file:line)``; with ``--threads`` the first frame is
``thread (tid): name``.
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
from collections import Counter
from pathlib import Path

CAPTURE_FILE_PREFIX = "hs_dataset/"
LAUNCHER_FUNCTIONS = frozenset({"run_scheduler_process"})  # capture's launcher: SGLang runs inside it, it is not a hook
SCHEDULER_LOOP_PREFIX = "Scheduler.event_loop"
THIRD_PARTY = frozenset(
    {"torch", "triton", "zmq", "numpy", "safetensors", "tqdm", "uvloop", "psutil", "transformers", "sgl_kernel", "flashinfer"}
)


def load(path: Path) -> list[tuple[list[str], int]]:
    """The stacks of a raw py-spy file (``.xz`` as kept in ``benchmarks/results``), outermost first, with their counts."""
    path = Path(path)
    text = lzma.open(path, "rt").read() if path.suffix == ".xz" else path.read_text()
    rows = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if count.isdigit():  # an empty stack: a sample with no Python frame (a native thread holding the GIL)
            rows.append((stack.split(";") if stack else [], int(count)))
    return rows


def _function(frame: str) -> str:
    return frame.split(" (", 1)[0]


def _file(frame: str) -> str:
    return frame.rpartition(" (")[2].rstrip(")").rsplit(":", 1)[0] if " (" in frame else ""


def _is_library(frame: str) -> bool:
    if frame.startswith("thread ("):
        return True
    file = _file(frame)
    top = file.split("/", 1)[0].removesuffix(".py")
    return not file or file.startswith("<") or top in sys.stdlib_module_names or top in THIRD_PARTY


def _is_capture(frame: str) -> bool:
    return _file(frame).startswith(CAPTURE_FILE_PREFIX) and _function(frame) not in LAUNCHER_FUNCTIONS


def owner(frames: list[str]) -> str:
    """``capture`` or ``sglang``: who owns a sample, by its innermost frame outside the libraries."""
    for frame in reversed(frames):
        if _is_capture(frame):
            return "capture"
        if not _is_library(frame) and _function(frame) not in LAUNCHER_FUNCTIONS:
            return "sglang"
    return "sglang"


def _is_scheduler(frames: list[str]) -> bool:
    return any(_function(f).startswith(SCHEDULER_LOOP_PREFIX) for f in frames)


def _thread_role(frames: list[str]) -> str:
    """A thread outside the scheduler loop, named by its outermost capture frame (its loop), else ``other``."""
    for frame in frames:
        if _is_capture(frame):
            return f"capture thread {_function(frame)}"
    return "other"


def _shares(counts: Counter, total: int) -> dict[str, float]:
    return {k: round(n / total, 3) for k, n in counts.most_common()} if total else {}


def gil_holders(rows: list[tuple[list[str], int]]) -> dict:
    """Of the samples where a thread held the GIL: the share of each holder."""
    counts: Counter = Counter()
    for frames, n in rows:
        counts[f"scheduler in {owner(frames)}" if _is_scheduler(frames) else _thread_role(frames)] += n
    total = sum(counts.values())
    return {"samples": total, "shares": _shares(counts, total)}


def scheduler_time(rows: list[tuple[list[str], int]]) -> dict:
    """Of the scheduler thread's samples (idle ones included, as recorded): the share whose owner is capture,
    and capture's functions that take the most (innermost capture frame)."""
    threads = {frames[0] for frames, _ in rows if frames and frames[0].startswith("thread (") and _is_scheduler(frames)}
    mine = [(frames, n) for frames, n in rows if frames and frames[0] in threads]
    total = sum(n for _, n in mine)
    by_owner: Counter = Counter()
    by_function: Counter = Counter()
    for frames, n in mine:
        who = owner(frames)
        by_owner[who] += n
        if who == "capture":
            by_function[_function(next(f for f in reversed(frames) if _is_capture(f)))] += n
    top = {k: round(n / total, 3) for k, n in by_function.most_common(8)} if total else {}
    return {"samples": total, "shares": _shares(by_owner, total), "capture_functions": top}


def summarize(gil: Path | None, threads: Path | None) -> dict:
    """Both summaries, for the files that exist."""
    out: dict = {}
    if gil is not None and Path(gil).exists():
        out["gil"] = gil_holders(load(gil))
    if threads is not None and Path(threads).exists():
        out["scheduler"] = scheduler_time(load(threads))
    if "gil" in out and out.get("scheduler", {}).get("samples"):
        # both recorded at one rate for one duration (one_pass_profile.py): the GIL-holder samples over one thread's
        # samples estimate the share of the time some thread held the GIL (two windows one after the other: an estimate)
        out["gil_held_share_est"] = round(out["gil"]["samples"] / out["scheduler"]["samples"], 3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gil", type=Path, help="py-spy raw file recorded with --gil")
    ap.add_argument("--threads", type=Path, help="py-spy raw file recorded with --threads --idle")
    args = ap.parse_args(argv)
    print(json.dumps(summarize(args.gil, args.threads), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

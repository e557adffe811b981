"""The py-spy summary of the GPU profile: who holds the scheduler process's GIL, and what the scheduler thread runs."""

from __future__ import annotations

import lzma
import sys
from pathlib import Path

from tests.fixtures.paths import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

from _spy_summary import gil_holders, load, owner, scheduler_time, summarize

LOOP = "<module> (<string>:1);run_scheduler_process (hs_dataset/server_patch/graph_capture.py:175);Scheduler.event_loop_overlap (scheduler.py:1601)"
REPLAY = "replay (hs_dataset/server_patch/graph_capture.py:210)"
SGLANG_STEP = f"{LOOP};Scheduler.run_batch (scheduler.py:2900);ModelRunner.forward (model_executor/model_runner.py:2100)"
HOOK_COPY = f"{LOOP};{REPLAY};HostCopier.snapshot (hs_dataset/server_patch/host_copy.py:296);Tensor.copy_ (torch/_tensor.py:10)"
GRAPH_IN_HOOK = (
    f"{LOOP};{REPLAY};DecodeCudaGraphRunner.execute (model_executor/cuda_graph_runner.py:1238);replay (torch/cuda/graphs.py:139)"
)
COLLECTOR = "_bootstrap (threading.py:1030);run (threading.py:1010);PieceCollector._loop (hs_dataset/server_patch/one_pass.py:279);_fill (hs_dataset/server_patch/one_pass.py:147)"


def _write(path: Path, lines: list[str], xz: bool = False) -> Path:
    text = "\n".join(lines) + "\n"
    if xz:
        path = path.with_suffix(".txt.xz")
        with lzma.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def test_a_sample_belongs_to_its_innermost_frame_outside_the_libraries() -> None:
    assert owner(HOOK_COPY.split(";")) == "capture"  # a torch copy capture makes is capture's
    assert owner(GRAPH_IN_HOOK.split(";")) == "sglang"  # SGLang's replay called from capture's wrapper is SGLang's
    assert owner(SGLANG_STEP.split(";")) == "sglang"  # under the launcher, SGLang's own step is SGLang's


def test_gil_holders_split_the_scheduler_by_owner_and_name_capture_threads_by_their_loop(tmp_path: Path) -> None:
    raw = _write(tmp_path / "gil.txt", [f"{SGLANG_STEP} 60", f"{HOOK_COPY} 10", f"{GRAPH_IN_HOOK} 10", f"{COLLECTOR} 15", " 5"], xz=True)
    summary = gil_holders(load(raw))
    assert summary["samples"] == 100
    assert summary["shares"] == {
        "scheduler in sglang": 0.7,
        "capture thread PieceCollector._loop": 0.15,
        "scheduler in capture": 0.1,
        "other": 0.05,  # the empty stack: a sample with no Python frame
    }


def test_scheduler_time_counts_only_the_scheduler_thread_and_names_captures_functions(tmp_path: Path) -> None:
    tid = "thread (1979): MainThread"
    lines = [f"{tid};{SGLANG_STEP} 30", f"{tid};{HOOK_COPY} 8", f"{tid};{GRAPH_IN_HOOK} 2", f"thread (2126): hs-one-pass;{COLLECTOR} 40"]
    summary = scheduler_time(load(_write(tmp_path / "threads.txt", lines)))
    assert summary["samples"] == 40
    assert summary["shares"] == {"sglang": 0.8, "capture": 0.2}
    assert summary["capture_functions"] == {"HostCopier.snapshot": 0.2}


def test_summarize_estimates_the_gil_held_share_from_both_files(tmp_path: Path) -> None:
    gil = _write(tmp_path / "gil.txt", [f"{SGLANG_STEP} 30", f"{COLLECTOR} 10"])
    threads = _write(tmp_path / "threads.txt", [f"thread (1): MainThread;{SGLANG_STEP} 80"])
    out = summarize(gil, threads)
    assert out["gil_held_share_est"] == 0.5
    assert summarize(tmp_path / "missing.txt", None) == {}

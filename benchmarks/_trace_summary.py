"""A torch-profiler (Chrome) trace reduced to where a server step's time went: a few numbers, not a 100 MB file.

Used by ``bench_server_gpu.py --profile-steps`` on the GPU host, so only the summary travels back:

* the GPU window, the union of kernel time in it (``kernel_busy_ms``) and what is left idle;
* the kernels, device copies and CUDA runtime calls that took the most time;
* for the small device-to-host copies SGLang makes every step (next tokens, logits), how long each waited
  between its ``cudaMemcpyAsync`` and the copy starting on the GPU (``small_dtoh_queue_ms``): a large copy
  queued on the same copy engine ahead of it shows up there, not in any kernel.
"""

from __future__ import annotations

import gzip
import json
import statistics
from collections import defaultdict
from pathlib import Path

SMALL_COPY_BYTES = 1 << 20


def _load(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total / 1e3


def _top(events: list[dict], n: int) -> list[dict]:
    by_name: dict[str, list[float]] = defaultdict(list)
    for e in events:
        by_name[e["name"][:90]].append(float(e["dur"]))
    rows = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:n]
    return [{"name": k, "count": len(v), "total_ms": round(sum(v) / 1e3, 3), "max_ms": round(max(v) / 1e3, 3)} for k, v in rows]


def _queue_delays(events: list[dict]) -> list[float]:
    """ms between the runtime call and the start of each small device-to-host copy it launched."""
    launched = {
        e["args"]["correlation"]: float(e["ts"]) for e in events if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    delays = []
    for e in events:
        args = e.get("args", {})
        if e.get("cat") == "gpu_memcpy" and "DtoH" in e["name"] and int(args.get("bytes", 1 << 40)) < SMALL_COPY_BYTES:
            t0 = launched.get(args.get("correlation"))
            if t0 is not None:
                delays.append((float(e["ts"]) - t0) / 1e3)
    return delays


def summarize_trace(path: Path) -> dict:
    events = _load(Path(path))
    kernels = [e for e in events if e.get("cat") == "kernel"]
    copies = [e for e in events if e.get("cat") in ("gpu_memcpy", "gpu_memset")]
    gpu = kernels + copies
    if not gpu:
        return {"trace": Path(path).name, "error": "no GPU events"}
    start = min(float(e["ts"]) for e in gpu)
    stop = max(float(e["ts"]) + float(e["dur"]) for e in gpu)
    busy = _union_ms([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in kernels])
    copy_bytes: dict[str, int] = defaultdict(int)
    for e in copies:
        copy_bytes[e["name"][:60]] += int(e.get("args", {}).get("bytes", 0))
    delays = _queue_delays(events)
    return {
        "trace": Path(path).name,
        "window_ms": round((stop - start) / 1e3, 3),
        "kernel_busy_ms": round(busy, 3),
        "gpu_idle_share": round(1 - busy / max((stop - start) / 1e3, 1e-9), 4),
        "kernels": _top(kernels, 15),
        "copies": _top(copies, 8),
        "copy_bytes": dict(copy_bytes),
        "runtime": _top([e for e in events if e.get("cat") == "cuda_runtime"], 12),
        "cpu_ops": _top([e for e in events if e.get("cat") == "cpu_op"], 15),
        "small_dtoh_queue_ms": {
            "count": len(delays),
            "median": round(statistics.median(delays), 3) if delays else None,
            "max": round(max(delays), 3) if delays else None,
            "total": round(sum(delays), 3),
        },
    }


if __name__ == "__main__":
    import sys

    print(json.dumps(summarize_trace(Path(sys.argv[1])), indent=1))

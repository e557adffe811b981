"""One core range per SGLang rank on a CPU server (``SGLANG_CPU_OMP_THREADS_BIND``).

SGLang's CPU path binds each rank's OpenMP threads to one NUMA node unless
``SGLANG_CPU_OMP_THREADS_BIND`` lists a core range per rank (``0-3|4-7``); with more
ranks than NUMA nodes (``tp: 2`` on a one-node laptop or CI machine) it refuses to
start (``sglang/srt/utils/numa_utils.py``). ``hs-dataset serve`` therefore splits
the cores this process may use (``os.sched_getaffinity``) into disjoint ranges, one
per server process, so ranks never share a core.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

__all__ = ["OMP_BIND_ENV", "cpu_rank_count", "format_bind", "parallel_sizes", "split_cores", "usable_cores"]

OMP_BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"

# SGLang's spellings (argparse also takes the unique prefixes --tp and --dp)
_SIZE_FLAGS = {
    "--tp-size": "tp",
    "--tensor-parallel-size": "tp",
    "--tp": "tp",
    "--dp-size": "dp",
    "--data-parallel-size": "dp",
    "--dp": "dp",
    "--pp-size": "pp",
    "--pipeline-parallel-size": "pp",
}
_DP_ATTENTION = "--enable-dp-attention"


def parallel_sizes(argv: Sequence[str]) -> tuple[dict[str, int], bool]:
    """The last tp/dp/pp value of each flag in ``argv`` (argparse semantics) and whether DP attention is on."""
    sizes = {"tp": 1, "dp": 1, "pp": 1}
    words = [str(w) for w in argv]
    for i, word in enumerate(words):
        flag, eq, value = word.partition("=")
        key = _SIZE_FLAGS.get(flag)
        if key is None:
            continue
        value = value if eq else (words[i + 1] if i + 1 < len(words) else "")
        if value.isdigit() and int(value) > 0:
            sizes[key] = int(value)
    return sizes, _DP_ATTENTION in words


def cpu_rank_count(argv: Sequence[str]) -> int:
    """Server processes SGLang starts for ``argv``: tp x pp per replica.

    ``--dp N`` alone starts N replicas; with ``--enable-dp-attention`` the DP groups
    partition the TP ranks instead and add no process (SGLang 0.5.23 resolves it to
    ``--attn-dp-size N``, which never adds processes either).
    """
    sizes, dp_attention = parallel_sizes(argv)
    replicas = 1 if dp_attention else sizes["dp"]
    return sizes["tp"] * sizes["pp"] * replicas


def usable_cores() -> list[int]:
    """Cores this process may run on (its affinity mask, which containers and ``taskset`` narrow)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def split_cores(cores: Sequence[int], ranks: int) -> list[list[int]]:
    """``ranks`` disjoint, contiguous, non-empty groups covering ``cores`` (sizes differ by at most one)."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    ordered = sorted(set(cores))
    if len(ordered) < ranks:
        raise ValueError(f"{len(ordered)} cores cannot give {ranks} ranks one core each")
    size, extra = divmod(len(ordered), ranks)
    groups, start = [], 0
    for rank in range(ranks):
        end = start + size + (1 if rank < extra else 0)
        groups.append(ordered[start:end])
        start = end
    return groups


def _ranges(cores: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5`` (the cpu-list syntax numactl and sgl-kernel read)."""
    runs: list[list[int]] = []
    for core in sorted(cores):
        if runs and core == runs[-1][-1] + 1:
            runs[-1].append(core)
        else:
            runs.append([core])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def format_bind(groups: Sequence[Sequence[int]]) -> str:
    """The ``SGLANG_CPU_OMP_THREADS_BIND`` value: one cpu list per rank, ``|``-separated, rank order."""
    return "|".join(_ranges(g) for g in groups)

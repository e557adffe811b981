"""What capture cost the build's server over one run, from the status files its hooks keep in the staging dir.

The hooks count the forward thread's wall time inside them (``hook_wall_ns``; of it, after decode graph
replays, ``replay_hook_wall_ns``), the passes they saw, and each write carries the CPU time of capture's
own threads and of the process (``server_patch/reporter.py``). Two readings, before and after a run, give
what that run cost: the forward thread's share is time SGLang's decode loop waits for, the threads' CPU
shares the process's GIL with it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

__all__ = ["capture_counters", "describe_capture_cost"]

_KEEP = (
    "extend_passes",
    "hook_wall_ns",
    "reserve_ns",
    "copy_ns",
    "dumps_written",
    "replay_hook_wall_ns",
    "decode_passes",
    "graph_decode_passes",
    "graph_decode_rows",
    "one_pass_rows",
    "one_pass_run_steps",
    "one_pass_pieces",
    "one_pass_refused",
    "one_pass_held_peak_bytes",
    "pinned_peak_bytes",
)


def capture_counters(staging_dir: str, *, settle: bool = False) -> dict[str, float]:
    """The counters of every status file in ``staging_dir``, summed over its writers (DP ranks); {} where there is none.

    ``settle``: first wait until the hooks have rewritten their files with what they counted by now (they do so at
    most every ``STATUS_INTERVAL_S``).
    """
    from hs_dataset.server_patch.contract.status import STATUS_INTERVAL_S, read_statuses

    if settle:
        time.sleep(2 * STATUS_INTERVAL_S)
    found: dict[str, float] = {}
    for status in read_statuses(staging_dir):
        for key, value in (status.get("counts") or {}).items():
            if (key in _KEEP or key.startswith("cpu_ms_")) and isinstance(value, (int, float)):
                found[key] = found.get(key, 0) + value
    return found


def describe_capture_cost(before: Mapping[str, float], after: Mapping[str, float]) -> str:
    """One clause: the hooks' forward-thread time a decode step (of it after replays), and capture's threads' CPU."""
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    steps = delta.get("decode_passes", 0)
    if not steps:
        return "the server's capture counters: no decode step counted"
    hooks, replay = delta.get("hook_wall_ns", 0) / steps / 1e6, delta.get("replay_hook_wall_ns", 0) / steps / 1e6
    threads = sum(v for k, v in delta.items() if k.startswith("cpu_ms_hs-")) / 1e3
    process = delta.get("cpu_ms_process", 0) / 1e3
    return (
        f"the server's hooks {hooks:.3f} ms of its forward thread a decode step over {steps:.0f} steps "
        f"({replay:.3f} ms after graph replays, {delta.get('graph_decode_passes', 0):.0f} of them), "
        f"capture's threads {threads:.1f} CPU s of the process's {process:.1f}"
    )

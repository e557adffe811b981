"""The plain progress line: one line a SLURM log or ``nohup.out`` can hold (no carriage return, no ANSI codes).

``build: 413/1000 samples, 1.2M tokens, 5,321 tok/s, 812.4 MiB written (open shard 96.1 MiB), ETA 4m10s``
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Snapshot", "count", "duration", "eta_s", "fields", "line", "size"]


@dataclass(frozen=True)
class Snapshot:
    """What a task has done at one moment; ``fresh``: the items this run did itself (the others were already done)."""

    name: str
    unit: str
    done: int
    total: int | None
    fresh: int
    tokens: int
    elapsed_s: float
    verb: str = "written"
    written: int | None = None  # bytes; None: the task moves no bytes
    open_bytes: int = 0  # bytes held for a shard not yet published (counted in ``written``)
    detail: Sequence[str] = ()
    tokens_label: str = "tokens"


def count(n: float) -> str:
    """A large count short: 950, 12.3k, 1.2M, 3.4G."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.1f}{suffix}"
    return f"{n:.0f}"


def size(nbytes: int) -> str:
    """Bytes in binary units: 512 B, 3.0 KiB, 812.4 MiB, 1.25 GiB."""
    if nbytes >= 2**30:
        return f"{nbytes / 2**30:.2f} GiB"
    if nbytes >= 2**20:
        return f"{nbytes / 2**20:.1f} MiB"
    if nbytes >= 2**10:
        return f"{nbytes / 2**10:.1f} KiB"
    return f"{nbytes} B"


def duration(seconds: float) -> str:
    """12s, 4m10s, 1h05m: what a person reads at a glance."""
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    if hours:
        return f"{hours}h{rest // 60:02d}m"
    return f"{rest // 60}m{rest % 60:02d}s" if rest >= 60 else f"{rest}s"


def eta_s(snap: Snapshot) -> float | None:
    """Seconds left at this run's pace: items already done before the run (resumed, skipped) took no time and do not count."""
    if snap.total is None or snap.fresh <= 0 or snap.elapsed_s <= 0:
        return None
    return max(0, snap.total - snap.done) * snap.elapsed_s / snap.fresh


def fields(snap: Snapshot) -> list[str]:
    """The line's parts after the count: tokens, rate, bytes and the task's own details (the bar shows these beside it)."""
    parts: list[str] = []
    if snap.tokens:
        parts.append(f"{count(snap.tokens)} {snap.tokens_label}")
        if snap.elapsed_s > 0:  # no rate from no time
            parts.append(f"{snap.tokens / snap.elapsed_s:,.0f} tok/s")
    if snap.written is not None:
        held = f" (open shard {size(snap.open_bytes)})" if snap.open_bytes else ""
        parts.append(f"{size(snap.written)} {snap.verb}{held}")
    return parts + list(snap.detail)


def line(snap: Snapshot, *, final: bool = False, stopped: bool = False) -> str:
    """The whole line; the final one says how long the task took instead of an ETA, a failed one when it stopped."""
    of = f"/{snap.total}" if snap.total is not None else ""
    left = eta_s(snap)
    if final or stopped:
        end = f"{'done in' if final else 'stopped after'} {duration(snap.elapsed_s)}"
    else:
        end = f"ETA {duration(left) if left is not None else '?'}"
    return f"{snap.name}: " + ", ".join([f"{snap.done}{of} {snap.unit}", *fields(snap), end])

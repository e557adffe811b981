"""Why a dump did not come: the hooks' status files (``server_patch/contract/status.py``) read before and after a request.

A request the server answered whose dump is late has one of a few causes, and each
is visible in what the hooks report: no status file at all (the hooks are not running,
or write somewhere else), no prefill pass reached the hooks since the request was
sent (a prefill CUDA graph replayed the model without running Python), or the request
was skipped as foreign (its id is not one the hooks own). Each is a
:class:`CaptureStopped` that ends the build at once, naming the cause and the fix, instead
of every request waiting ``dump_timeout_s`` times its retries. Anything else (a slow
writer, a busy server) is left to the timeout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hs_dataset.errors import ServerValidationError
from hs_dataset.server_patch.contract.status import read_statuses

__all__ = ["GRACE_S", "CaptureStopped", "HookReport", "diagnose", "read_report"]

GRACE_S = 3.0  # after the server answered, how long a dump may be late before the hooks' reports are consulted
NO_REPORT_S = 10.0  # ... and how long without any status file before "the hooks are not running" is concluded


class CaptureStopped(ServerValidationError):
    """The server cannot produce this build's dumps, for a reason its hooks reported; the message names the fix."""


@dataclass(frozen=True)
class HookReport:
    """The hooks' status files of one staging directory, summed over the writers."""

    writers: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    recent_foreign: tuple[str, ...] = ()
    recent_dumps: tuple[str, ...] = ()
    facts: dict[str, Any] = field(default_factory=dict)
    rid_prefix: str = "hs-"
    last_error: str | None = None
    last_unusable: str | None = None
    counted_at: float = 0.0  # wall-clock time of the oldest writer's counters (0: no writer)
    skipped: tuple[str, ...] = ()  # status files that were not ours (wrong kind of file, size, format or field type), and why

    def count(self, name: str) -> int:
        return int(self.counts.get(name, 0))


def read_report(staging_dir: str) -> HookReport:
    """The status files of ``staging_dir`` summed; each is typed by :func:`~hs_dataset.server_patch.contract.status.status_problem`."""
    skipped: list[str] = []
    statuses = read_statuses(staging_dir, skipped)
    counts: dict[str, int] = {}
    foreign: list[str] = []
    dumps: list[str] = []
    for status in statuses:
        for name, value in (status.get("counts") or {}).items():
            counts[name] = counts.get(name, 0) + value
        foreign += status.get("recent_foreign") or []
        dumps += status.get("recent_dumps") or []
    first = statuses[0] if statuses else {}
    return HookReport(
        writers=len(statuses),
        counts=counts,
        recent_foreign=tuple(foreign),
        recent_dumps=tuple(dumps),
        facts=dict(first.get("facts") or {}),
        rid_prefix=first.get("rid_prefix") or "hs-",
        last_error=next((s["last_error"][:500] for s in statuses if s.get("last_error")), None),
        last_unusable=next((s["last_unusable"][:500] for s in statuses if s.get("last_unusable")), None),
        counted_at=min((float(s.get("counted_at") or 0.0) for s in statuses), default=0.0),
        skipped=tuple(skipped[:8]),
    )


def diagnose(
    url: str, staging_dir: str, key: str, rid: str, before: HookReport, after: HookReport, *, answered_at: float, late_s: float
) -> str | None:
    """The cause of a missing dump for request ``rid`` (file stem ``key``), or ``None`` while it may still come.

    ``answered_at``: wall-clock time the server answered the request; the hooks counted its
    prefill (if they saw it) before that. Only counters taken after it prove a pass was
    *not* seen, so a status writer running late (a loaded machine) is never taken for a
    cause. ``late_s``: how long the dump has been missing since the answer.
    """
    if after.writers == 0 or after.counted_at <= answered_at:
        if late_s < NO_REPORT_S:
            return None
        what = "no capture hook reports" if after.writers == 0 else f"no capture hook has reported for {late_s:.0f} s"
        if after.skipped:
            what += f" (status files skipped as not the hooks': {after.skipped[0]})"
        return (
            f"SGLang server {url} answered request {rid}, but {what} into {staging_dir}: hs_dataset's hooks are not "
            "running there (they failed to load or are stuck, see the server log for 'hs_dataset capture', or the server "
            "writes to another staging directory); restart it with `hs-dataset serve --config <card>`"
        )
    if rid in after.recent_foreign or key in after.recent_foreign:
        return (
            f"SGLang server {url} skipped request {rid} as foreign: its hooks capture only request ids starting with "
            f"{after.rid_prefix!r}; use a run id under that prefix, or restart the server with this card's "
            "sglang.staging.rid_prefix"
        )
    if key != rid and rid in after.recent_dumps:
        return (
            f"SGLang server {url} wrote the dump of request {rid} under its request id, but this client waited for the "
            f"content key {key}: its hooks see request ids (ForwardBatch.rids); this is a bug, please report it"
        )
    if after.count("hook_errors") > before.count("hook_errors"):
        return (
            f"SGLang server {url}: the capture hooks failed while it ran request {rid} ({after.last_error or 'see the server log'}); "
            "the forward pass went on without them, so no dump will come: fix the cause in the server log and restart it"
        )
    if after.count("unusable_passes") > before.count("unusable_passes"):
        return (
            f"SGLang server {url}: the prefill passes reaching the capture hooks are unusable ({after.last_unusable}), so "
            f"no dump of request {rid} will come"
        )
    if after.count("extend_passes") == before.count("extend_passes"):
        return (
            f"SGLang server {url} answered request {rid}, but no prefill pass reached the capture hooks: a prefill CUDA "
            "graph replays the model without running Python hooks; restart it with --disable-prefill-cuda-graph "
            "(`hs-dataset serve` passes it wherever the installed SGLang has the flag)"
        )
    return None

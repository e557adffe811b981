"""What this process knows of the decode-graph route (:mod:`.graph_capture`), for the hooks to report.

Why a module of its own: the launcher's scheduler entry installs the route before any
hook exists, and the hooks' runtime, made later by whichever registration comes first,
must tell from it whether decode steps will reach them. Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ROUTE", "Route"]


@dataclass
class Route:
    """The route's state in this process (one scheduler process: one model runner of the target)."""

    installed: bool = False  # the capture and replay entries were wrapped
    reason: str | None = None  # why not (the structure was not found), or why it stopped holding
    early: bool = False  # the hs_dataset hooks are being registered before the decode graphs are captured
    captured: bool | None = None  # after capture: decode graphs were captured with the hooks in them (None: not yet)


ROUTE = Route()

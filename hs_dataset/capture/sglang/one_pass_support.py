"""Whether a server can capture a generation's states as it decodes them (one pass), judged from what it reports.

One pass needs the decode steps of a one-pass request to reach the capture hooks: every step runs
them where the server decodes without CUDA graphs (CPU servers, ``--disable-cuda-graph``), and
inside the graphs only where the hooks were put on before the graphs were captured (the hooks
report that as the status fact ``decode_capture``: ``graph``, ``eager`` or ``off: <why>``). It
also needs request ids (one-pass rows are filed by request) and hooks, not the legacy source patch.
Judged from the running server's own reports, never from its version number.
"""

from __future__ import annotations

from hs_dataset.capture.sglang.endpoints import Endpoint
from hs_dataset.capture.sglang.validate import one_pass_support
from hs_dataset.server_patch.contract.mechanism import Mechanism

__all__ = ["one_pass_blocker"]


def one_pass_blocker(ep: Endpoint) -> str | None:
    """Why ``ep`` cannot capture generations in one pass, or None when it can."""
    if not ep.staging_dir:
        return f"{ep.url}: the client does not know where the server writes"
    if not ep.uses_rids:
        return f"{ep.url}: its hooks cannot tell requests apart (they key dumps by content), and decode rows need request ids"
    if ep.mechanism == Mechanism.LEGACY.value:
        return f"{ep.url}: the legacy source patch captures prefills only"
    support = one_pass_support(ep.staging_dir)
    return None if support.works else f"{ep.url}: {support.reason}"

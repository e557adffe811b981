"""Whether a server can capture a generation's states as it decodes them (one pass), judged from what it reports.

One pass needs the decode steps of a one-pass request to reach the capture hooks: every step runs
them where the server decodes without CUDA graphs (CPU servers, ``--disable-cuda-graph``), and
inside the graphs only where the hooks were put on before the graphs were captured (the hooks
report that as the status fact ``decode_capture``: ``graph``, ``eager`` or ``off: <why>``). It
also needs request ids (one-pass rows are filed by request) and hooks, not the legacy source patch.
Judged from the running server's own reports, never from its version number.
"""

from __future__ import annotations

from hs_dataset.capture.sglang.diagnose import read_report
from hs_dataset.capture.sglang.endpoints import Endpoint
from hs_dataset.server_patch.contract.mechanism import Mechanism

__all__ = ["DECODE_CAPTURE_FACT", "one_pass_blocker"]

DECODE_CAPTURE_FACT = "decode_capture"


def one_pass_blocker(ep: Endpoint) -> str | None:
    """Why ``ep`` cannot capture generations in one pass, or None when it can."""
    if not ep.staging_dir:
        return f"{ep.url}: the client does not know where the server writes"
    if not ep.uses_rids:
        return f"{ep.url}: its hooks cannot tell requests apart (they key dumps by content), and decode rows need request ids"
    if ep.mechanism == Mechanism.LEGACY.value:
        return f"{ep.url}: the legacy source patch captures prefills only"
    facts = read_report(ep.staging_dir).facts
    decode = facts.get(DECODE_CAPTURE_FACT)
    if isinstance(decode, str):
        return None if decode in ("graph", "eager") else f"{ep.url}: decode steps escape capture ({decode})"
    if str(ep.server_info.get("device") or "cuda") == "cpu" or ep.server_info.get("disable_cuda_graph"):
        return None  # no decode graph: the hooks run on every decode step
    return f"{ep.url}: decode CUDA graphs are on and its hooks do not say they capture inside them"

"""A server that comes back after a failure is read again before its answers are trusted.

The checks at start (:mod:`~hs_dataset.capture.sglang.validate`) hold only while the server
they checked keeps running. A server that failed (no connection, HTTP 5xx) may have been
restarted in between with another model, another SGLang release or other aux layers; its
answers would then be stored as if they were the checked server's, silently mixing two
datasets. So an endpoint marked down is flagged (:attr:`Endpoint.recheck`) and, before the
next request sent to it, its ``/server_info`` is read again and compared with what was
recorded when it was first trusted (:attr:`Endpoint.identity`); a changed server is taken
out of rotation for the rest of the run (:attr:`Endpoint.retired`), with one line naming
the URL and what changed.
"""

from __future__ import annotations

import logging
from typing import Any

from hs_dataset.capture.sglang.endpoints import Endpoint
from hs_dataset.capture.sglang.http import BadResponseError, HTTPStatusError, get_json

__all__ = ["identity_of", "read_identity", "recheck_endpoint"]

logger = logging.getLogger("hs_dataset.capture.sglang.recheck")


def _aux_layers(info: dict) -> Any:
    """The aux layers hs_dataset's model hook reports in ``forward_hooks`` (None: not reported)."""
    specs = info.get("forward_hooks")
    if not isinstance(specs, list):
        return None
    for spec in specs:
        config = spec.get("config") if isinstance(spec, dict) else None
        if isinstance(config, dict) and "hf_aux_layer_ids" in config:
            return config["hf_aux_layer_ids"]
    return None


def identity_of(info: dict) -> dict[str, Any]:
    """What must not change while a run trusts a server: its model, its SGLang version, the aux layers its hooks capture."""
    return {"model": info.get("model_path"), "version": info.get("version"), "aux layers": _aux_layers(info)}


async def read_identity(ep: Endpoint, session: Any, timeout_s: float, max_bytes: int) -> dict[str, Any] | None:
    """``identity_of`` the server's ``/server_info`` now; None where it gave no description (an HTTP error, a bad body).

    A connection error propagates: the server is still down, and the caller treats it so.
    """
    try:
        info = await get_json(session, ep.url + "/server_info", timeout_s, max_bytes)
    except (HTTPStatusError, BadResponseError):
        return None
    return identity_of(info) if isinstance(info, dict) else None


async def recheck_endpoint(ep: Endpoint, session: Any, timeout_s: float, max_bytes: int) -> str | None:
    """Read ``ep`` again if it is flagged; a changed server is retired, and the one-line reason returned (None: same server).

    Before the first request (no identity yet) the identity read now becomes the one
    later reads are compared with.
    """
    if ep.retired is not None:
        return ep.retired
    if ep.identity is not None and not ep.recheck:
        return None
    now = await read_identity(ep, session, timeout_s, max_bytes)
    if now is None:  # no description now: not a changed server, not yet the same one either (a busy server's 503)
        if ep.identity is None:
            return None  # the baseline is read before a later request
        raise ConnectionError(f"{ep.url}/server_info gave no description of the server; it is read again before its next request")
    if ep.identity is None:
        ep.identity, ep.recheck = now, False
        return None
    changed = [f"{key} {ep.identity[key]!r} -> {now[key]!r}" for key in ep.identity if ep.identity[key] != now.get(key)]
    if not changed:
        ep.recheck = False
        return None
    ep.retired = (
        f"SGLang server {ep.url} came back from a failure as a different server ({'; '.join(changed)}): taken out of rotation "
        "for this run; restart it as it was (the same card and model), or start the run again"
    )
    logger.error("%s", ep.retired)
    return ep.retired

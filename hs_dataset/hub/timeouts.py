"""Bound every Hub request in time, so a missing network fails in seconds instead of hanging.

huggingface_hub's shared HTTP client is created with ``timeout=None``: a black-holed
route (a firewall dropping packets, a dead proxy) would block ``push`` forever. The
push command installs a client with a connect/read/write timeout of
:func:`hub_timeout_s` seconds (``HS_DATASET_HUB_TIMEOUT_S``, default 60), keeping the
library's own request hooks.
"""

from __future__ import annotations

import os

__all__ = ["DEFAULT_TIMEOUT_S", "hub_timeout_s", "limit_hub_timeouts"]

DEFAULT_TIMEOUT_S = 60.0


def hub_timeout_s() -> float:
    """Seconds any single Hub connect/read/write may wait (``HS_DATASET_HUB_TIMEOUT_S`` overrides)."""
    raw = os.environ.get("HS_DATASET_HUB_TIMEOUT_S")
    try:
        value = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        value = DEFAULT_TIMEOUT_S
    return value if value > 0 else DEFAULT_TIMEOUT_S


def limit_hub_timeouts(seconds: float | None = None) -> float:
    """Make huggingface_hub's shared client time out after ``seconds`` (default :func:`hub_timeout_s`); returns it."""
    import huggingface_hub
    from huggingface_hub.utils import _http

    limit = float(seconds) if seconds else hub_timeout_s()

    def bounded_client():
        client = _http.default_client_factory()
        client.timeout = limit  # httpx(2) turns a number into connect/read/write/pool timeouts
        return client

    huggingface_hub.set_client_factory(bounded_client)
    return limit

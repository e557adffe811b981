"""The one error of launching a server: what cannot be planned or started, and how to fix it."""

from __future__ import annotations

from hs_dataset.errors import HsDatasetError

__all__ = ["ServeError"]


class ServeError(HsDatasetError, RuntimeError):
    """The server cannot be planned or started; the message says how to fix it."""

"""The one error of a server set-up capture cannot be correct for, raised while the hooks load."""

from __future__ import annotations

from hs_dataset.errors import HsDatasetError

__all__ = ["SetupError"]


class SetupError(HsDatasetError, RuntimeError):
    """The server is configured in a way capture cannot be correct for; raised at start-up."""

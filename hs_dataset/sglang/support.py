"""Which SGLang versions capture works with, and by which mechanism."""

from __future__ import annotations

from hs_dataset.errors import HsDatasetError
from hs_dataset.wire.sglang_version import parse_version

__all__ = ["SUPPORTED", "UnsupportedVersionError", "support_for"]

# (lowest, highest-exclusive, mechanism, status)
SUPPORTED: list[tuple[tuple[int, int, int], tuple[int, int, int], str, str]] = [
    ((0, 5, 23), (0, 6, 0), "aux_return", "verified (0.5.23, CPU, tiny DeepseekV3, float32)"),
    ((0, 5, 15), (0, 5, 23), "layer_hooks", "read from source, not run (request ids available)"),
    ((0, 5, 9), (0, 5, 15), "layer_hooks", "read from source, not run (no request ids: dumps keyed by content)"),
]


class UnsupportedVersionError(HsDatasetError, ValueError):
    """This SGLang version cannot be captured from (the message names the fix)."""


def support_for(version: str) -> tuple[str, str]:
    """(mechanism, status) for an SGLang version; raises :class:`UnsupportedVersionError` if unsupported."""
    v = parse_version(version)
    for low, high, mechanism, status in SUPPORTED:
        if low <= v < high:
            return mechanism, status
    if v <= (0, 5, 5):
        raise UnsupportedVersionError(
            f"SGLang {version} has no forward hooks: patch it with `hs-dataset patch apply` and start it with "
            "HS_CAPTURE_STAGING_DIR / HS_CAPTURE_LAYER_IDS set (docs/SGLANG.md, 'SGLang <= 0.5.5')"
        )
    supported = ", ".join(f"{'.'.join(map(str, lo))} <= v < {'.'.join(map(str, hi))}" for lo, hi, _, _ in SUPPORTED)
    raise UnsupportedVersionError(f"SGLang {version} is not supported by this hs_dataset (supported: {supported})")

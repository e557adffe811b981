"""SGLang version strings as comparable tuples (both sides compare them)."""

from __future__ import annotations

import re

__all__ = ["parse_version"]


def parse_version(version: str) -> tuple[int, int, int]:
    """``"0.5.23"`` / ``"0.5.23.post1"`` / ``"0.5.5rc2"`` -> ``(0, 5, 23)``."""
    m = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(version))
    if not m:
        raise ValueError(f"cannot parse a version from {version!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)

"""The header line of hs_dataset's source patch of SGLang <= 0.5.5, shared by the patcher and ``hs-dataset serve``.

``hs_dataset.server_patch.legacy`` writes it (and checks the whole edit); the launch plan only
needs to know, from the installed ``deepseek_v2.py``, that a patch is there, so both read
the line from here. Stdlib only.
"""

from __future__ import annotations

__all__ = ["BEGIN", "PATCH_VERSION", "carries_patch"]

# v2: the hook moved from hs_dataset.sglang.legacy.hook to hs_dataset.server_patch.legacy.hook.
PATCH_VERSION = 2
BEGIN = f"# >>> hs_dataset-patch v{PATCH_VERSION} original-sha256="


def carries_patch(source: str) -> bool:
    """Whether a ``deepseek_v2.py`` text holds the patch's header line (``hs-dataset patch check`` says if it is intact)."""
    return any(line.startswith(BEGIN) for line in source.splitlines())

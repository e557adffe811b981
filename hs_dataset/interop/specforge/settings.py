"""What an export to SpecForge's layout takes beyond the common settings: typed, frozen, unknown keys refused."""

from __future__ import annotations

from dataclasses import dataclass

from hs_dataset.errors import UsageError
from hs_dataset.interop.settings import ExportSettings

__all__ = ["SpecForgeExportSettings"]


@dataclass(frozen=True, kw_only=True)
class SpecForgeExportSettings(ExportSettings):
    """The common export settings plus SpecForge's own.

    ``group_size``: files per ``rows_{g}-{g+N}`` directory. ``keep_dtype``: the stored
    dtype instead of bfloat16, which SpecForge 0.2.0's trainer needs.
    """

    group_size: int = 2000
    keep_dtype: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 1:
            raise UsageError(f"group_size must be >= 1, got {self.group_size!r}")

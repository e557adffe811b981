"""What an export to speculators' layout takes beyond the common settings: typed, frozen, unknown keys refused."""

from __future__ import annotations

from dataclasses import dataclass

from hs_dataset.errors import UsageError
from hs_dataset.interop.settings import ExportSettings

__all__ = ["SpeculatorsExportSettings"]


@dataclass(frozen=True, kw_only=True)
class SpeculatorsExportSettings(ExportSettings):
    """The common export settings plus speculators' own.

    ``num_hidden_layers``: L, when the manifest does not record it (speculators names the
    final state id L). ``token_freq``: write ``token_freq.pt`` (speculators' vocab
    mapping input).
    """

    num_hidden_layers: int | None = None
    token_freq: bool = True

    def __post_init__(self) -> None:
        layers = self.num_hidden_layers
        if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 1):
            raise UsageError(f"num_hidden_layers (--num-hidden-layers) must be a layer count >= 1, got {layers!r}")

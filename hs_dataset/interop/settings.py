"""What an export or an import is asked to do: typed, validated, unknown keys refused (``TypeError`` naming it).

The twins share their names: ``aux_layer_ids`` (HF ``hidden_states`` indexes, ascending),
``num_hidden_layers`` (L, where the data does not record it) and ``overwrite`` (an
earlier export's own files only) mean the same on both sides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hs_dataset.errors import UsageError

__all__ = ["ExportSettings", "ImportSettings"]


@dataclass(frozen=True, kw_only=True)
class ExportSettings:
    """How a dataset is written in a trainer's layout.

    ``aux_layer_ids``: the stored aux layers to export (default all). ``num_hidden_layers``:
    L, when the manifest does not record it (speculators names the final state id L).
    ``verify_hashes``: check every shard's BLAKE3 hash while reading. ``token_freq``
    (speculators): write ``token_freq.pt``. ``group_size`` (SpecForge): files per
    ``rows_{g}-{g+N}`` directory. ``keep_dtype`` (SpecForge): the stored dtype instead of
    bfloat16, which SpecForge 0.2.0's trainer needs.
    """

    overwrite: bool = False
    aux_layer_ids: Sequence[int] | None = None
    num_hidden_layers: int | None = None
    verify_hashes: bool = False
    token_freq: bool = True
    group_size: int = 2000
    keep_dtype: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 1:
            raise UsageError(f"group_size must be >= 1, got {self.group_size!r}")


@dataclass(frozen=True, kw_only=True)
class ImportSettings:
    """What an import states about the data (neither trainer's layout records it) and how it is stored.

    ``config``: a config card name or ``.yaml`` path (supplies layer ids, dtype, model), or
    a free-form name for the imported dataset. ``aux_layer_ids``: the aux layers. ``num_hidden_layers``:
    L, for the trainers' default ``[2, L//2, L-3]`` when no ids are given. ``model_path``: a
    local model directory whose fingerprint and final-norm weight/eps are recorded;
    ``model_id``: the model id to record. ``storage``, ``shard_bytes``: as for
    ``ShardWriter`` (``None``: its default size). ``overwrite``: delete an earlier export in
    the destination first (its own files only).
    """

    config: str
    aux_layer_ids: Sequence[int] | None = None
    num_hidden_layers: int | None = None
    model_path: str | None = None
    model_id: str | None = None
    storage: str = "native"
    shard_bytes: int | None = None
    overwrite: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.config, str) or not self.config:
            raise UsageError(f"ImportSettings.config must name a config card or the imported dataset, got {self.config!r}")

"""What an export or an import is asked to do: typed, validated, unknown keys refused (``TypeError`` naming it).

The twins share their names: ``aux_layer_ids`` (HF ``hidden_states`` indexes, ascending),
``num_hidden_layers`` (L, where the data does not record it) and ``overwrite`` (an
earlier export's own files only) mean the same on both sides. :class:`ExportSettings`
holds what every export takes; each trainer's options are its subclass, next to its
exporter (``interop/speculators/settings.py``, ``interop/specforge/settings.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TypeVar

from hs_dataset.errors import UsageError

__all__ = ["ExportSettings", "ImportSettings"]

_Settings = TypeVar("_Settings", bound="ExportSettings")


@dataclass(frozen=True, kw_only=True)
class ExportSettings:
    """What every trainer's export is asked: the base of each trainer's own settings class.

    ``overwrite``: replace an earlier export in the destination (its own files only).
    ``aux_layer_ids``: the stored aux layers to export (default all). ``verify_hashes``:
    check every shard's BLAKE3 hash while reading. ``allow_incomplete``: export a dataset whose build has not
    finished (killed or stopped); without it the export refuses one with
    :class:`~hs_dataset.errors.IncompleteDatasetError`, since a trainer would take half a dataset for the whole. A trainer's options live in its own
    subclass (``interop/<trainer>/settings.py``, named in :mod:`hs_dataset.interop.trainers`);
    an export handed this base class runs with that trainer's defaults.
    """

    overwrite: bool = False
    aux_layer_ids: Sequence[int] | None = None
    verify_hashes: bool = False
    allow_incomplete: bool = False

    @classmethod
    def adopt(cls: type[_Settings], settings: ExportSettings) -> _Settings:
        """``settings`` as this trainer's class: the base class gets this trainer's defaults, another trainer's is refused."""
        if isinstance(settings, cls):
            return settings
        if type(settings) is not ExportSettings:
            raise UsageError(f"this export takes {cls.__name__} (or the common ExportSettings), not {type(settings).__name__}")
        return cls(**{f.name: getattr(settings, f.name) for f in fields(ExportSettings)})


@dataclass(frozen=True, kw_only=True)
class ImportSettings:
    """What an import states about the data (neither trainer's layout records it) and how it is stored.

    ``config``: a config card name or ``.yaml`` path (supplies layer ids, dtype, model), or
    a free-form name for the imported dataset. ``aux_layer_ids``: the aux layers. ``num_hidden_layers``:
    L, for the trainers' default ``[2, L//2, L-3]`` when no ids are given. ``model_path``: a
    local model directory whose fingerprint and final-norm weight/eps are recorded;
    ``model_id``: the model id to record. ``storage``, ``shard_bytes``: as for
    ``ShardWriter`` (``None``: its default size). ``overwrite``: delete an earlier export in
    the destination first (its own files only). ``max_length``: the longest sample in tokens
    the import accepts, checked on the files' declared shapes before any state is read
    (``None``: the card's ``max_length``, else the model's ``max_position_embeddings``, else
    :data:`~hs_dataset.interop.importing.DEFAULT_MAX_TOKENS`); a hostile file cannot make
    the import allocate more than that many tokens' states.
    """

    config: str
    aux_layer_ids: Sequence[int] | None = None
    num_hidden_layers: int | None = None
    model_path: str | None = None
    model_id: str | None = None
    storage: str = "native"
    shard_bytes: int | None = None
    overwrite: bool = False
    max_length: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.config, str) or not self.config:
            raise UsageError(f"ImportSettings.config must name a config card or the imported dataset, got {self.config!r}")
        if self.max_length is not None and (
            isinstance(self.max_length, bool) or not isinstance(self.max_length, int) or self.max_length < 1
        ):
            raise UsageError(f"ImportSettings.max_length must be a positive number of tokens, got {self.max_length!r}")

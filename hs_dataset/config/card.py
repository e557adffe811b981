"""The card: one validated builder config (``cards/NAME.yaml``) made of the typed sections.

:attr:`Card.fingerprint` hashes the normalised card so the manifest records which
config produced a dataset; the dataset's identity is narrower (what defines the data:
``formats/identity.py``), so editing Hub metadata or a timeout does not strand a dataset.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr, ValidationError, field_validator

from hs_dataset.config.problems import CardError, card_error
from hs_dataset.config.sections import (
    BackendSection,
    DatasetCardSection,
    LayersSection,
    LimitsSection,
    ModelSection,
    RegenerateSection,
    Section,
    SGLangServerSection,
    ShardsSection,
    SourceSection,
    StateDtypeName,
)

__all__ = ["Card", "card_from_dict"]


class Card(Section):
    """A validated builder config: one `cards/NAME.yaml`. Sections are described below."""

    name: str = Field(
        min_length=1,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Config name; a shipped card's name equals its file name. Names the dataset config (Hub folder, manifest). Required.",
    )
    description: str = Field("", description="What this config captures, for people and the Hub dataset card. Default empty.")
    model: ModelSection = Field(description="The target model (section below). Required.")
    layers: LayersSection = Field(description="The captured layers (section below). Required.")
    dtype: StateDtypeName = Field(description="Dtype the states are captured and stored in. Required.")
    max_length: int = Field(4096, gt=0, description="Longest sample in tokens; longer ones follow `overflow`. Default 4096.")
    overflow: Literal["truncate", "drop"] = Field(
        "truncate",
        description="What happens to a sample longer than `max_length`: cut to it, or left out (and reported). Default `truncate`.",
    )
    limits: LimitsSection = Field(
        default_factory=LimitsSection, description="Bounds on rows and chat templates (section below, docs/LIMITS.md)."
    )
    source: SourceSection = Field(default_factory=SourceSection, description="The source rows (section below).")
    regenerate: RegenerateSection = Field(
        default_factory=RegenerateSection, description="Regenerating assistant turns with the target before capture (section below)."
    )
    backend: BackendSection = Field(description="The capture backend, chosen by `name`: `hf` or `sglang` (sections below). Required.")
    shards: ShardsSection = Field(default_factory=ShardsSection, description="Shard size and storage encoding (section below).")
    dataset_card: DatasetCardSection = Field(default_factory=DatasetCardSection, description="Hub dataset-card metadata (section below).")
    sglang: SGLangServerSection = Field(
        default_factory=SGLangServerSection, description="The SGLang server for `hs-dataset serve` (section below)."
    )

    _source_path: str = PrivateAttr("<dict>")

    @field_validator("description")
    @classmethod
    def _strip(cls, text: str) -> str:
        return text.strip()

    @property
    def source_path(self) -> str:
        """Where this card came from (a file, ``cards/NAME.yaml``, or ``<dict>``), for error messages."""
        return self._source_path

    @property
    def aux_layer_ids(self) -> list[int]:
        """The explicit ``layers.aux``; a preset's ids depend on the model: :meth:`aux_layers_for`."""
        if self.layers.aux is None:
            raise CardError(
                f"{self.source_path}: layers.preset {self.layers.preset}: the aux ids depend on the model's layer count; "
                "read them with card.aux_layers_for(num_hidden_layers)"
            )
        return list(self.layers.aux)

    def aux_layers_for(self, num_layers: int) -> list[int]:
        """The aux ids (HF ``hidden_states`` indexes) this card captures on a ``num_layers``-layer model."""
        try:
            return self.layers.resolve(num_layers)
        except ValueError as exc:
            raise CardError(f"{self.source_path}: {exc}") from None

    @property
    def final_state(self) -> str:
        return self.layers.final

    @property
    def fingerprint(self) -> str:
        """sha256 of the normalised card: key order, and stating a default versus leaving it out, do not matter."""
        normal = self.model_dump(mode="json", exclude_defaults=True)
        return hashlib.sha256(json.dumps(normal, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        """Every key with its value (defaults filled in), as plain JSON types; :func:`card_from_dict` reads it back."""
        return self.model_dump(mode="json")

    def with_overrides(self, **sections: Any) -> Card:
        """A new validated card with top-level sections shallow-merged (e.g. ``model={"path": ...}``).

        A mapping (or section model) is merged key by key into the section; anything else
        replaces it. A backend override naming another backend replaces the backend.
        """
        raw = self.to_dict()
        for key, value in sections.items():
            if isinstance(value, BaseModel):
                value = value.model_dump(mode="json", exclude_unset=True)
            old = raw.get(key)
            switches_backend = key == "backend" and isinstance(value, Mapping) and value.get("name", old["name"]) != old["name"]
            if isinstance(value, Mapping) and isinstance(old, dict) and not switches_backend:
                raw[key] = {**old, **value}
            else:
                raw[key] = value
        card = card_from_dict(raw, f"{self.source_path} (with overrides)")
        card._source_path = self.source_path
        return card


def card_from_dict(raw: Mapping[str, Any], where: str = "<dict>") -> Card:
    """Validate a card given as a mapping (e.g. :meth:`Card.to_dict` sent to a worker process as JSON).

    Every problem becomes one :class:`CardError` naming ``where`` (never a pydantic error).
    """
    if not isinstance(raw, Mapping):
        raise CardError(f"{where}: a card must be a YAML mapping of sections, got {type(raw).__name__}")
    try:
        # Through JSON so that strict types behave the same for YAML and Python input
        # (tuples are lists, YAML dates are strings).
        card = Card.model_validate_json(json.dumps(raw, default=str))
    except ValidationError as exc:
        raise card_error(exc, where, Card) from None
    card._source_path = where
    return card

"""Builder configs ("cards"): one YAML file per config, the single source of its truth.

Cards live in the repository's ``cards/`` folder, which installs as the
``hs_dataset.cards`` package. A card names the model, the aux layers (as HF
``hidden_states`` indexes), the final-state kind, dtype, length policy, source
data, backend settings and shard size. :attr:`Card.fingerprint` hashes the card so
the manifest can prove which config produced a dataset.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.resources
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["Card", "load_card", "list_cards", "card_from_dict", "CardError"]

_FINAL_KINDS = ("pre_norm", "post_norm")
_DTYPES = ("float32", "bfloat16", "float16")
_CONVENTION = "hf_hidden_states_index"


class CardError(ValueError):
    """A card is missing, malformed or inconsistent."""


@dataclass(frozen=True)
class Card:
    """A validated builder config."""

    raw: dict[str, Any]
    source_path: str

    # ---- identity
    @property
    def name(self) -> str:
        return self.raw["name"]

    @property
    def description(self) -> str:
        return str(self.raw.get("description", "")).strip()

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.raw, sort_keys=True, default=str).encode()).hexdigest()

    # ---- model and layers
    @property
    def model(self) -> dict[str, Any]:
        return dict(self.raw["model"])

    @property
    def aux_layer_ids(self) -> list[int]:
        return list(self.raw["layers"]["aux"])

    @property
    def final_state(self) -> str:
        return self.raw["layers"].get("final", "pre_norm")

    @property
    def dtype(self) -> str:
        return self.raw["dtype"]

    @property
    def max_length(self) -> int:
        return int(self.raw.get("max_length", 4096))

    @property
    def overflow(self) -> str:
        return self.raw.get("overflow", "truncate")

    # ---- pipeline parts
    @property
    def source(self) -> dict[str, Any]:
        return dict(self.raw.get("source") or {})

    @property
    def backend(self) -> dict[str, Any]:
        return dict(self.raw["backend"])

    @property
    def shards(self) -> dict[str, Any]:
        return dict(self.raw.get("shards") or {})

    def with_overrides(self, **sections: Any) -> "Card":
        """A copy with top-level sections shallow-merged (e.g. ``model={"path": ...}``)."""
        raw = copy.deepcopy(self.raw)
        for key, value in sections.items():
            if isinstance(value, dict) and isinstance(raw.get(key), dict):
                raw[key] = {**raw[key], **value}
            else:
                raw[key] = value
        return _validated(raw, self.source_path)


def _validated(raw: Any, where: str) -> Card:
    if not isinstance(raw, dict):
        raise CardError(f"{where}: a card must be a YAML mapping")
    for key in ("name", "model", "layers", "dtype", "backend"):
        if key not in raw:
            raise CardError(f"{where}: missing required key {key!r}")
    layers = raw["layers"]
    if layers.get("convention", _CONVENTION) != _CONVENTION:
        raise CardError(f"{where}: layers.convention must be {_CONVENTION!r} (HF output_hidden_states indexes)")
    aux = layers.get("aux")
    if not isinstance(aux, list) or not aux or not all(isinstance(i, int) and i >= 0 for i in aux) or sorted(set(aux)) != aux:
        raise CardError(f"{where}: layers.aux must be a non-empty ascending list of distinct HF hidden_states indexes, got {aux!r}")
    if layers.get("final", "pre_norm") not in _FINAL_KINDS:
        raise CardError(f"{where}: layers.final must be one of {_FINAL_KINDS}")
    if raw["dtype"] not in _DTYPES:
        raise CardError(f"{where}: dtype must be one of {_DTYPES}, got {raw['dtype']!r}")
    if raw.get("overflow", "truncate") not in ("truncate", "drop"):
        raise CardError(f"{where}: overflow must be 'truncate' or 'drop'")
    if "name" not in raw["backend"]:
        raise CardError(f"{where}: backend.name is required (hf or sglang)")
    return Card(raw=raw, source_path=where)


def card_from_dict(raw: dict[str, Any], where: str = "<dict>") -> Card:
    """Validate a card given as a mapping (e.g. sent to a worker process as JSON)."""
    return _validated(copy.deepcopy(raw), where)


def _builtin_cards() -> dict[str, Any]:
    root = importlib.resources.files("hs_dataset.cards")
    return {entry.name[: -len(".yaml")]: entry for entry in root.iterdir() if entry.name.endswith(".yaml")}


def list_cards() -> list[str]:
    """Names of the cards shipped with hs_dataset."""
    return sorted(_builtin_cards())


def load_card(name_or_path: str | Path) -> Card:
    """Load a shipped card by name, or any card file by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        text, where = path.read_text(encoding="utf-8"), str(path)
    else:
        cards = _builtin_cards()
        if str(name_or_path) not in cards:
            raise CardError(f"unknown config {str(name_or_path)!r}; available: {', '.join(sorted(cards))} (or pass a path to a .yaml card)")
        entry = cards[str(name_or_path)]
        text, where = entry.read_text(encoding="utf-8"), f"cards/{entry.name}"
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CardError(f"{where}: not valid YAML ({exc})") from None
    card = _validated(raw, where)
    if path.suffix not in (".yaml", ".yml") and card.name != str(name_or_path):
        raise CardError(f"{where}: the card's name {card.name!r} must match its file name")
    return card

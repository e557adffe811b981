"""Cards by name (shipped in ``cards/``, installed as ``hs_dataset.cards``) or by path."""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Any

import yaml

from hs_dataset.config.card import Card, card_from_dict
from hs_dataset.config.problems import CardError

__all__ = ["list_cards", "load_card"]


def _builtin_cards() -> dict[str, Any]:
    root = importlib.resources.files("hs_dataset.cards")
    return {entry.name[: -len(".yaml")]: entry for entry in root.iterdir() if entry.name.endswith(".yaml")}


def list_cards() -> list[str]:
    """Names of the cards shipped with hs_dataset."""
    return sorted(_builtin_cards())


def load_card(name_or_path: str | Path) -> Card:
    """Load a shipped card by name, or any card file by path."""
    path = Path(name_or_path)
    is_file = path.suffix in (".yaml", ".yml")
    if is_file and path.exists():
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
    card = card_from_dict(raw, where)
    if not is_file and card.name != str(name_or_path):
        raise CardError(f"{where}: name: {card.name!r} must match the file name; write `name: {name_or_path}`")
    return card

"""Cards by name (shipped in ``cards/``, installed as ``hs_dataset.cards``) or by path."""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Any

import yaml

from hs_dataset.config.card import Card, card_from_dict
from hs_dataset.config.problems import CardError

__all__ = ["MAX_CARD_ALIASES", "MAX_CARD_BYTES", "MAX_CARD_DEPTH", "list_cards", "load_card"]

MAX_CARD_BYTES = 1024 * 1024  # a card is a few kilobytes
MAX_CARD_ALIASES = 64  # `*name` references in one card (each may stand for a whole subtree: billion laughs)
MAX_CARD_DEPTH = 32  # nesting of mappings and lists (the deepest real key is sglang.staging.x: 3)


class _CardBound(yaml.YAMLError):
    """A card over one of the loader's bounds (the message says which)."""


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses more than MAX_CARD_ALIASES aliases and nesting deeper than MAX_CARD_DEPTH.

    Aliases are counted while composing, before anything is built from them, so a small file cannot stand for
    a gigantic tree; depth is counted there too, before the composer's recursion could overflow the stack.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent, index):  # PyYAML's signature
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_CARD_ALIASES:
                raise _CardBound(f"more than {MAX_CARD_ALIASES} aliases (*name); write the values out instead of referencing them")
        self._depth += 1
        try:
            if self._depth > MAX_CARD_DEPTH:
                raise _CardBound(f"nested more than {MAX_CARD_DEPTH} levels deep; a card's sections are at most 3 levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _read_card_file(path: Path) -> str:
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_CARD_BYTES + 1)
    except OSError as exc:
        raise CardError(f"{path}: cannot read the card ({exc.strerror or exc}); check the path and its permissions") from None
    if len(data) > MAX_CARD_BYTES:
        raise CardError(f"{path}: over {MAX_CARD_BYTES} bytes, not a card (cards are a few kilobytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CardError(f"{path}: not UTF-8 text (byte {exc.start}); save the card as UTF-8") from None


def _builtin_cards() -> dict[str, Any]:
    root = importlib.resources.files("hs_dataset.cards")
    return {entry.name[: -len(".yaml")]: entry for entry in root.iterdir() if entry.name.endswith(".yaml")}


def list_cards() -> list[str]:
    """Names of the cards shipped with hs_dataset."""
    return sorted(_builtin_cards())


def load_card(name_or_path: str | Path) -> Card:
    """Load a shipped card by name, or any card file by path."""
    path = Path(name_or_path)
    is_file = path.suffix in (".yaml", ".yml") or "/" in str(name_or_path)  # a path, never a shipped name
    if is_file:
        if not path.exists():
            raise CardError(f"no such file: {path}; pass an existing .yaml card, or a shipped config name ({', '.join(list_cards())})")
        text, where = _read_card_file(path), str(path)
    else:
        cards = _builtin_cards()
        if str(name_or_path) not in cards:
            raise CardError(f"unknown config {str(name_or_path)!r}; available: {', '.join(sorted(cards))} (or pass a path to a .yaml card)")
        entry = cards[str(name_or_path)]
        text, where = entry.read_text(encoding="utf-8"), f"cards/{entry.name}"
    try:
        raw = yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except _CardBound as exc:
        raise CardError(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        raise CardError(f"{where}: not valid YAML ({' '.join(str(exc).split())})") from None
    card = card_from_dict(raw, where)
    if not is_file and card.name != str(name_or_path):
        raise CardError(f"{where}: name: {card.name!r} must match the file name; write `name: {name_or_path}`")
    return card

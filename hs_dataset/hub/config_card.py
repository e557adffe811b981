"""Which config card a push describes the dataset with: the one that built it.

The README's front matter (``dataset_card:`` license, pretty_name, tags, ...), its
description and the public model name come from that card. The caller may give it (a
:class:`~hs_dataset.config.Card`, a shipped name or a card file's path); otherwise the
manifest's ``metadata.config_name`` names it, which finds only a card shipped with
hs_dataset. A dataset built from a card file elsewhere is pushed with that file, and one
built from no card (an import) with ``card=False``.
"""

from __future__ import annotations

import os
from typing import Literal

from hs_dataset.config import Card, list_cards, load_card
from hs_dataset.errors import UsageError
from hs_dataset.formats.metadata import DatasetMetadata

__all__ = ["CardChoice", "card_for_push", "card_model_name"]

CardChoice = Card | str | os.PathLike | Literal[False] | None
"""A card, a shipped card's name or a card file's path; None: the one the manifest names; False: none."""


def card_for_push(card: CardChoice, metadata: DatasetMetadata, *, config: str, where: str) -> Card | None:
    """The config card whose metadata the pushed README carries (None only for ``card=False``).

    ``where`` names the dataset in errors; ``config`` (the repo folder) stands in for a
    manifest without ``config_name``. A card that names another config than the manifest
    is refused: its metadata would describe another dataset.
    """
    if card is False:
        return None
    if isinstance(card, Card):
        chosen = card
    elif card is not None:
        chosen = load_card(card)
    else:
        chosen = _recorded_card(str(metadata.config_name or config), where)
    built_by = metadata.config_name
    if built_by and chosen.name != built_by:
        raise UsageError(
            f"{where}: the dataset was built by config {built_by!r}, but the card {chosen.source_path} is {chosen.name!r}; "
            "pass the card that built it (or card=False / --no-card to push without card metadata)"
        )
    return chosen


def _recorded_card(name: str, where: str) -> Card:
    """The shipped card the manifest names, or one error that says how to give the card."""
    if name not in list_cards():
        raise UsageError(
            f"{where}: the dataset was built by config {name!r}, which is not a card shipped with hs_dataset, so the card "
            "(its dataset_card: license, pretty_name, tags, ...) cannot be found; pass the card file that built it "
            "(card=PATH, hs-dataset push --card PATH), or card=False (--no-card) to push without card metadata"
        )
    return load_card(name)


def card_model_name(card: Card | None) -> str | None:
    """The model the card names (its id, else its path), which names the model where the manifest only has a local path."""
    return (card.model.id or card.model.path) if card is not None else None

"""Builder configs ("cards"): one YAML file per config, validated into typed, frozen models.

Cards live in the repository's ``cards/`` folder, which installs as the
``hs_dataset.cards`` package. A card names the model, the aux layers (as HF
``hidden_states`` indexes), the final-state kind, dtype, length policy, source
data, backend settings, shard size, dataset-card metadata and the SGLang server.
Every key is declared here with its meaning; an unknown key, a wrong type or a value
out of range is refused with a :class:`CardError` naming the file, the key path and
the fix, instead of being silently ignored. docs/CARDS.md is rendered from these
models (scripts/render_card_docs.py). :attr:`Card.fingerprint` hashes the
normalised card so the manifest records which config produced a dataset (the
dataset's identity covers only what defines the data: formats/identity.py).

This package is the public facade: callers import from ``hs_dataset.config``. The
parts: :mod:`.sections` (the section models), :mod:`.card` (the :class:`Card`),
:mod:`.problems` (pydantic errors as :class:`CardError` lines) and :mod:`.loading`
(cards by name or path).
"""

from __future__ import annotations

from hs_dataset.config.card import Card, card_from_dict
from hs_dataset.config.loading import list_cards, load_card
from hs_dataset.config.problems import DOCS_HINT, CardError
from hs_dataset.config.sections import (
    BackendSection,
    DatasetCardSection,
    HFBackendSection,
    LayersSection,
    LimitsSection,
    ModelSection,
    RegenerateSection,
    SGLangBackendSection,
    SGLangServerSection,
    ShardsSection,
    SourceSection,
    StagingSection,
)

__all__ = [
    "DOCS_HINT",
    "BackendSection",
    "Card",
    "CardError",
    "DatasetCardSection",
    "HFBackendSection",
    "LayersSection",
    "LimitsSection",
    "ModelSection",
    "RegenerateSection",
    "SGLangBackendSection",
    "SGLangServerSection",
    "ShardsSection",
    "SourceSection",
    "StagingSection",
    "card_from_dict",
    "list_cards",
    "load_card",
]

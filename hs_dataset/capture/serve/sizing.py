"""Will the card's longest sample fit the server's capture pools? Asked before the server starts.

A request's states stay in the pinned pool until all its chunks are copied and written
(chunked prefill assembles one dump per request), and its dump must fit the staging
budget. A sample longer than either would be refused by the server on every retry: a
build that looks stuck, then a lost sample. So ``hs-dataset serve`` refuses such a card
up front, naming the setting to change and the size it needs.
"""

from __future__ import annotations

from hs_dataset.capture.serve.errors import ServeError
from hs_dataset.codecs.registry import get_encoding, state_encoding_for
from hs_dataset.config import Card
from hs_dataset.dtypes import state_dtype

__all__ = ["DEFAULT_PINNED_POOL_BYTES", "DEFAULT_STAGING_BYTES", "largest_sample_bytes", "refuse_samples_that_cannot_fit"]

# hs_dataset.server_patch.config.CaptureConfig's defaults (a unit test holds the two together)
DEFAULT_PINNED_POOL_BYTES = 2 << 30
DEFAULT_STAGING_BYTES = 16 << 30
_GiB = float(1 << 30)


def largest_sample_bytes(card: Card, hidden_size: int, num_aux: int) -> int:
    """State bytes of a ``max_length``-token sample: ``num_aux`` aux layers and the final state, in the card's storage."""
    encoding = get_encoding(state_encoding_for(state_dtype(card.dtype), card.shards.storage))
    return card.max_length * (num_aux + 1) * encoding.row_bytes(hidden_size)


def refuse_samples_that_cannot_fit(card: Card, hidden_size: int, num_aux: int) -> None:
    """:class:`ServeError` when a ``max_length`` sample exceeds the pinned pool or the staging budget."""
    need = largest_sample_bytes(card, hidden_size, num_aux)
    staging = card.sglang.staging
    bounds = (
        ("sglang.staging.pinned_pool_bytes", staging.pinned_pool_bytes or DEFAULT_PINNED_POOL_BYTES),
        ("sglang.staging.max_bytes", staging.max_bytes or DEFAULT_STAGING_BYTES),
    )
    for setting, have in bounds:
        if need > have:
            raise ServeError(
                f"a sample of max_length {card.max_length} tokens holds {need / _GiB:.2f} GiB of states "
                f"({num_aux} aux + final, hidden {hidden_size}, {card.dtype}, storage {card.shards.storage}), "
                f"more than {setting} ({have / _GiB:.2f} GiB) can hold: raise {setting} to at least {need} "
                "(a few times that to keep several long samples in flight), lower max_length, or store them smaller "
                "(shards.storage: nf4)"
            )

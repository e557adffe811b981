"""The one vocabulary check of token ids, wherever ids enter: shards (verify, exports), imports, regeneration records.

A token id outside ``[0, vocab_size)`` is not a token of the model: an embedding lookup
with it fails or, worse, reads another row. Hashes do not catch it (a re-hashed shard or
an edited record is self-consistent), so every path that takes ids from a file checks
them here against the vocabulary the manifest records: the model's ``vocab_size``, else
the tokenizer's. Where no vocabulary is known (a manifest that records neither, an import
without ``--model-path``, a regeneration record read without its model), ids are bounded
by :data:`MAX_VOCAB_SIZE`, the largest vocabulary a model config may claim
(``model/model_config.py``): no token of any model lies above it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from hs_dataset.errors import FormatError
from hs_dataset.formats.metadata import DatasetMetadata

__all__ = [
    "MAX_VOCAB_SIZE",
    "Outside",
    "check_token_ids",
    "describe_outside",
    "first_outside",
    "non_integer_dtype",
    "outside_vocabulary",
    "vocab_end",
    "vocab_size_of",
]

MAX_VOCAB_SIZE = 16_777_216  # model_config.py's bound on a config's vocab_size


def vocab_size_of(metadata: DatasetMetadata) -> int | None:
    """The bound ids must stay below: the model's vocabulary size, else the tokenizer's; None when neither is recorded."""
    if metadata.vocab_size:
        return int(metadata.vocab_size)
    tokenizer = metadata.tokenizer
    return int(tokenizer.vocab_size) if tokenizer is not None and tokenizer.vocab_size else None


def vocab_end(vocab_size: int | None) -> int:
    """The exclusive bound ids are checked against: ``vocab_size``, else :data:`MAX_VOCAB_SIZE` (no model is larger)."""
    return vocab_size if vocab_size is not None else MAX_VOCAB_SIZE


class Outside(NamedTuple):
    """The ids outside the vocabulary: how many, and the first one (its position and value), for a one-line message."""

    total: int
    position: int
    token: int


def outside_vocabulary(ids: Any, vocab_size: int | None) -> Outside | None:
    """The ids outside ``[0, vocab_end(vocab_size))``, None when all are inside; ids may be a tensor, an array or a
    list of ints (Python ints of any size: an answer from a server is not yet int64).

    The one comparison every path uses (shards, imports, regeneration records, pre-tokenized and rendered source
    rows, ``/generate`` answers, the in-process capture), so a bound cannot drift between them. Arrays are checked
    in one vectorized pass; a list whose smallest and largest ids are inside is passed without a Python loop.
    """
    end = vocab_end(vocab_size)
    if isinstance(ids, torch.Tensor):
        ids = ids.detach().cpu().to(torch.int64).numpy()
    if isinstance(ids, np.ndarray):
        bad = np.flatnonzero((ids < 0) | (ids >= end))
        return Outside(int(bad.size), int(bad[0]), int(ids.flat[bad[0]])) if bad.size else None
    if not len(ids) or (min(ids) >= 0 and max(ids) < end):
        return None
    bad_list = [(k, int(t)) for k, t in enumerate(ids) if not 0 <= t < end]
    return Outside(len(bad_list), *bad_list[0]) if bad_list else None


def first_outside(ids: Any, vocab_size: int | None) -> tuple[int, int] | None:
    """(position, id) of the first id outside ``[0, vocab_size)`` (None: :data:`MAX_VOCAB_SIZE`); see
    :func:`outside_vocabulary`."""
    found = outside_vocabulary(ids, vocab_size)
    return (found.position, found.token) if found is not None else None


def describe_outside(found: Outside, vocab_size: int | None, name: str = "input_ids") -> str:
    """The one wording of ids outside the vocabulary, for every path's message: ``name`` (the field), the first bad id's
    position and value, the bound (and that it is the ceiling where no vocab_size is known), and how many there are."""
    bound = f"the vocabulary [0, {vocab_end(vocab_size)})"
    if vocab_size is None:
        bound += " (no vocab_size known: the largest a model may have)"
    more = f" ({found.total} ids outside it)" if found.total > 1 else ""
    return f"{name}[{found.position}] = {found.token} is outside {bound}{more}"


def non_integer_dtype(ids: Any) -> str | None:
    """The dtype of a tensor or array of ids that is not an integer type (bool, float, complex), else None.

    Why: converting such ids to int64 (as every writer does) truncates 5.7 to 5, makes True
    a 1 and drops an imaginary part, so a file of float ids would be stored as other, valid
    looking tokens. Lists are typed per element where they are read (JSON records, answers).
    """
    if isinstance(ids, torch.Tensor):
        bad = ids.dtype == torch.bool or ids.dtype.is_floating_point or ids.dtype.is_complex
        return str(ids.dtype).removeprefix("torch.") if bad else None
    if isinstance(ids, np.ndarray):
        return None if np.issubdtype(ids.dtype, np.integer) else str(ids.dtype)
    return None


def check_token_ids(
    ids: Sequence[int] | torch.Tensor | np.ndarray, vocab_size: int | None, *, where: str, sample: str, fix: str, name: str = "input_ids"
) -> None:
    """Raise a one-line FormatError naming ``where``, the sample, the field (``name``), the first id outside the
    vocabulary and the bound (or the dtype of a tensor or array that holds no integers); ``fix``: what to do.

    ``vocab_size`` None (not known): ids are checked against :data:`MAX_VOCAB_SIZE`.
    """
    kind = non_integer_dtype(ids)
    if kind is not None:
        raise FormatError(f"{where}: sample {sample!r}: {name} holds {kind} values, not integer token ids; {fix}")
    found = outside_vocabulary(ids, vocab_size)
    if found is not None:
        raise FormatError(f"{where}: sample {sample!r}: {describe_outside(found, vocab_size, name)}; {fix}")

"""The manifest's claims that no hash covers: the aux layer ids, the capture dtype, the vocabulary, the norm's eps.

Why here: shard hashes prove the shards' bytes, and the identity hash proves the
metadata was not edited after the capture, but a manifest written (and hashed) with a
wrong claim passes both. Aux layer ids of ``[2, 2, 2]`` or ``[4, 3, 2]`` would make a
drafter read one layer three times or the layers in the wrong order, ids past the
model's layers name states no model has, and a ``metadata.dtype`` the shards do not
store would make readers and exporters decode them as something else. These checks
are cheap (no shard is read), so they run wherever a manifest is parsed: ``verify``,
every reader, remote datasets and followers.

The shards' dtypes are tied to the manifest's ``tensors`` encodings by the reader
(each header's dtype against the encoding's storage dtype, packed or not); this module
ties ``metadata.dtype`` to those encodings, so the chain reaches the headers.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

from hs_dataset.codecs.registry import get_encoding
from hs_dataset.dtypes import STATE_DTYPES
from hs_dataset.errors import FormatError, UnsupportedFormatError
from hs_dataset.formats.metadata import DatasetMetadata
from hs_dataset.formats.shard_layout import AUX_KEY, FINAL_KEY
from hs_dataset.formats.vocabulary import MAX_VOCAB_SIZE

__all__ = ["check_aux_layer_ids", "check_claims", "check_dtype_claim", "check_norm_eps", "check_vocab_sizes"]

_FIX = "restore the manifest from a copy or rebuild the dataset"


def check_claims(metadata: DatasetMetadata, tensors: Mapping[str, Any], where: str) -> None:
    """Every claim of this module; the first wrong one is a FormatError naming ``where`` and the field."""
    check_aux_layer_ids(metadata, where)
    check_dtype_claim(metadata, tensors, where)
    check_vocab_sizes(metadata, where)
    check_norm_eps(metadata, where)


def check_aux_layer_ids(metadata: DatasetMetadata, where: str) -> None:
    """Aux ids strictly increasing, non-negative, and below ``num_hidden_layers`` where the metadata records it.

    Id ``L`` (= ``num_hidden_layers``) is HF's post-norm final state, stored apart and
    never an aux id (``capture/serve/layer_ids.py`` refuses it at capture). A manifest
    without ``num_hidden_layers`` (older imports) gets the order and sign checks only:
    the model's depth is not known, so no upper bound can be proved.
    """
    ids = list(metadata.aux_layer_ids or ())
    if any(i < 0 for i in ids):
        raise FormatError(f"{where}: metadata.aux_layer_ids {ids} holds a negative id (ids index HF hidden_states from 0); {_FIX}")
    if any(b <= a for a, b in itertools.pairwise(ids)):
        raise FormatError(
            f"{where}: metadata.aux_layer_ids {ids} is not strictly increasing (each layer is captured once, in order); {_FIX}"
        )
    layers = metadata.num_hidden_layers
    if layers is not None and ids and ids[-1] >= layers:
        raise FormatError(
            f"{where}: metadata.aux_layer_ids {ids} reaches id {ids[-1]}, past the model's metadata.num_hidden_layers {layers} "
            f"(aux ids are 0..{layers - 1}; id {layers} is the final state); {_FIX}"
        )


def check_dtype_claim(metadata: DatasetMetadata, tensors: Mapping[str, Any], where: str) -> None:
    """``metadata.dtype`` is a state dtype the stored encoding can hold: the plain encoding's own, any for a scaled one.

    A plain encoding (bf16, f16, f32) stores the capture dtype as it is, so the two must
    agree; a scaled one (fp8, mxfp4, nf4) quantizes whatever was captured, so the
    capture dtype only has to be a state dtype. A manifest without ``dtype`` (none
    written so far) is not judged.
    """
    claimed = metadata.dtype
    if claimed is None:
        return
    if claimed not in STATE_DTYPES:
        raise FormatError(f"{where}: metadata.dtype {claimed[:40]!r} is not a hidden-state dtype ({', '.join(STATE_DTYPES)}); {_FIX}")
    names = {entry.get("encoding") if isinstance(entry, dict) else None for key, entry in tensors.items() if key in (FINAL_KEY, AUX_KEY)}
    if len(names) != 1 or not isinstance(name := names.pop(), str):
        return  # no state encoding, or two: the tensor table's own check names it
    try:
        encoding = get_encoding(name)
    except UnsupportedFormatError:
        return  # a newer encoding: the tensor table's check refuses it with the upgrade hint
    if not encoding.scaled and encoding.decoded != claimed:
        raise FormatError(
            f"{where}: metadata.dtype {claimed!r} disagrees with the shards, which store {encoding.decoded} "
            f"(tensors.{FINAL_KEY}.encoding {encoding.name!r}); {_FIX}"
        )


def check_vocab_sizes(metadata: DatasetMetadata, where: str) -> None:
    """``vocab_size`` (the model's) and ``tokenizer.vocab_size``, where recorded, are in ``[1, MAX_VOCAB_SIZE]``.

    They are the bound every token id is checked against (``formats/vocabulary.py``), so a
    claim outside what a model config may have would switch that check off or make it refuse everything.
    """
    tokenizer = metadata.tokenizer
    claims = (("vocab_size", metadata.vocab_size), ("tokenizer.vocab_size", tokenizer.vocab_size if tokenizer is not None else None))
    for name, size in claims:
        if size is not None and not 1 <= size <= MAX_VOCAB_SIZE:
            raise FormatError(
                f"{where}: metadata.{name} {size} is outside [1, {MAX_VOCAB_SIZE}] (no model has such a vocabulary, "
                f"and token ids are checked against it); {_FIX}"
            )


def check_norm_eps(metadata: DatasetMetadata, where: str) -> None:
    """``final_norm.eps``, where recorded, is a finite number in ``[0, 1)``: the RMSNorm's epsilon, as imports require."""
    norm = metadata.final_norm
    eps = norm.eps if norm is not None else None
    if eps is not None and not (math.isfinite(eps) and 0 <= eps < 1):
        raise FormatError(f"{where}: metadata.final_norm.eps {eps} is not a small non-negative number (an RMSNorm epsilon); {_FIX}")

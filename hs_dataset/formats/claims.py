"""The manifest's claims that no hash covers: the aux layer ids, the capture dtype, the vocabulary, the norm's eps,
the regeneration's token ids.

Why here: shard hashes prove the shards' bytes, and the identity hash proves the
metadata was not edited after the capture, but a manifest written (and hashed) with a
wrong claim passes both. Aux layer ids of ``[2, 2, 2]`` or ``[4, 3, 2]`` would make a
drafter read one layer three times or the layers in the wrong order, ids past the
model's layers name states no model has, and a ``metadata.dtype`` the shards do not
store would make readers and exporters decode them as something else. The stop and
structure ids a regeneration recorded (``metadata.regeneration``) must be token ids of the
model, and no id both: a stop id ends an answer, a structure id refuses it. These checks
are cheap (no shard is read), so they run wherever a manifest is parsed: ``verify``,
every reader, remote datasets and followers.

The shards' dtypes are tied to the manifest's ``tensors`` encodings by the reader
(each header's dtype against the encoding's storage dtype, packed or not); this module
ties ``metadata.dtype`` to those encodings, so the chain reaches the headers.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from hs_dataset.codecs.registry import get_encoding
from hs_dataset.dtypes import STATE_DTYPES
from hs_dataset.errors import FormatError, UnsupportedFormatError
from hs_dataset.formats.metadata import DatasetMetadata
from hs_dataset.formats.shard_layout import AUX_KEY, FINAL_KEY
from hs_dataset.formats.vocabulary import MAX_VOCAB_SIZE, describe_outside, outside_vocabulary, vocab_size_of

__all__ = [
    "MAX_NUM_HIDDEN_LAYERS",
    "aux_layer_ids_problem",
    "check_aux_layer_ids",
    "check_claims",
    "check_dtype_claim",
    "check_norm_eps",
    "check_regeneration_ids",
    "check_vocab_sizes",
]

_FIX = "restore the manifest from a copy or rebuild the dataset"
# The deepest model a config may describe (model/model_config.py's bound on num_hidden_layers; formats cannot import
# model): where a model's depth is not known, no aux id reaches it.
MAX_NUM_HIDDEN_LAYERS = 1024


def check_claims(metadata: DatasetMetadata, tensors: Mapping[str, Any], where: str) -> None:
    """Every claim of this module; the first wrong one is a FormatError naming ``where`` and the field."""
    check_aux_layer_ids(metadata, where)
    check_dtype_claim(metadata, tensors, where)
    check_vocab_sizes(metadata, where)
    check_norm_eps(metadata, where)
    check_regeneration_ids(metadata, where)


def check_aux_layer_ids(metadata: DatasetMetadata, where: str) -> None:
    """Aux ids strictly increasing, non-negative, and below ``num_hidden_layers`` (:func:`aux_layer_ids_problem`)."""
    ids = metadata.aux_layer_ids or ()
    problem = aux_layer_ids_problem(ids, metadata.num_hidden_layers, layers_field="metadata.num_hidden_layers")
    if problem is not None:
        raise FormatError(f"{where}: metadata.aux_layer_ids {problem}; {_FIX}")


def aux_layer_ids_problem(ids: Sequence[int], num_hidden_layers: int | None, *, layers_field: str = "num_hidden_layers") -> str | None:
    """Why ``ids`` cannot be a model's aux layer ids, starting with the ids (None: they can); the one check of a
    manifest's claim and an import's ids.

    Id ``L`` (= ``num_hidden_layers``) is HF's post-norm final state, stored apart and
    never an aux id (``capture/serve/layer_ids.py`` refuses it at capture). Where the
    model's depth is not known (``num_hidden_layers`` None: older imports), ids are
    bounded by :data:`MAX_NUM_HIDDEN_LAYERS`, the deepest model a config may describe.
    ``layers_field``: how the message names the depth.
    """
    ids = list(ids)
    if any(i < 0 for i in ids):
        return f"{ids} holds a negative id (ids index HF hidden_states from 0)"
    if any(b <= a for a, b in itertools.pairwise(ids)):
        return f"{ids} is not strictly increasing (each layer is captured once, in order)"
    if not ids:
        return None
    if num_hidden_layers is not None and ids[-1] >= num_hidden_layers:
        return (
            f"{ids} reaches id {ids[-1]}, past the model's {layers_field} {num_hidden_layers} "
            f"(aux ids are 0..{num_hidden_layers - 1}; id {num_hidden_layers} is the final state)"
        )
    if num_hidden_layers is None and ids[-1] >= MAX_NUM_HIDDEN_LAYERS:
        return (
            f"{ids} reaches id {ids[-1]}, past {MAX_NUM_HIDDEN_LAYERS - 1}, the last aux id of the deepest model a config "
            f"may describe ({MAX_NUM_HIDDEN_LAYERS} layers; no {layers_field} is known to bound them closer)"
        )
    return None


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


def check_regeneration_ids(metadata: DatasetMetadata, where: str) -> None:
    """``metadata.regeneration``'s stop and structure ids inside the vocabulary the metadata records, and no id in both.

    A stop id outside the vocabulary never ends an answer and a structure id outside it never
    refuses one, so such a record describes rules no build applied; an id in both lists would be
    cut at and refused at once. A record without structure ids (written before they were
    recorded) is judged on its stop ids alone.
    """
    record = metadata.regeneration
    if record is None:
        return
    size = vocab_size_of(metadata)
    for name in ("stop_token_ids", "structure_token_ids"):
        ids = getattr(record, name) or ()
        found = outside_vocabulary(list(ids), size)
        if found is not None:
            raise FormatError(f"{where}: {describe_outside(found, size, f'metadata.regeneration.{name}')}; {_FIX}")
    both = sorted(set(record.stop_token_ids or ()) & set(record.structure_token_ids or ()))
    if both:
        raise FormatError(
            f"{where}: metadata.regeneration.structure_token_ids holds stop id(s) {both[:5]} of metadata.regeneration.stop_token_ids "
            f"(an answer is cut at a stop id, never refused for it); {_FIX}"
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

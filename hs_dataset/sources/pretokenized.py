"""Rows that are already token ids: validate them instead of trusting them.

An id outside the tokenizer's vocabulary would index past the embedding table on
the server (or silently hit an untrained row), so it is a malformed row. A row
without ``loss_mask`` is ambiguous; the policy is the caller's choice and the
default ("all": every token supervised) is counted in the report with a note.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from hs_dataset.formats.vocabulary import describe_outside, outside_vocabulary
from hs_dataset.sources.report import MalformedRowError

__all__ = ["MissingMaskPolicy", "is_pretokenized", "read_pretokenized"]

MissingMaskPolicy = Literal["all", "reject"]


def is_pretokenized(row: Mapping[str, Any]) -> bool:
    return row.get("input_ids") is not None


def _as_int_array(name: str, raw: Any) -> np.ndarray:
    if hasattr(raw, "detach"):  # torch tensor
        raw = raw.detach().cpu().numpy()
    try:
        arr = np.asarray(raw)
    except (ValueError, TypeError) as exc:
        raise MalformedRowError(f"{name}: not a flat list of integers ({exc})") from None
    if arr.ndim != 1:
        raise MalformedRowError(f"{name}: must be a flat list, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iub":
        raise MalformedRowError(f"{name}: must hold integers, got {arr.dtype}")
    return arr


def read_pretokenized(
    row: Mapping[str, Any], *, vocab_size: int, missing_mask: MissingMaskPolicy = "all"
) -> tuple[list[int], list[bool], bool]:
    """Return ``(input_ids, loss_mask, mask_was_given)`` or raise :class:`MalformedRowError`."""
    ids = _as_int_array("input_ids", row["input_ids"])
    if ids.dtype.kind == "b":
        raise MalformedRowError("input_ids: must hold integers, got booleans")
    if ids.size == 0:
        raise MalformedRowError("input_ids: is empty")
    bad = outside_vocabulary(ids, vocab_size)  # the package's one vocabulary check, and its wording
    if bad is not None:
        raise MalformedRowError(describe_outside(bad, vocab_size))
    raw_mask = row.get("loss_mask")
    if raw_mask is None:
        if missing_mask == "reject":
            raise MalformedRowError("loss_mask: missing (missing_loss_mask='reject')")
        return ids.astype(np.int64).tolist(), [True] * int(ids.size), False
    mask = _as_int_array("loss_mask", raw_mask)
    if mask.shape != ids.shape:
        raise MalformedRowError(f"loss_mask: has {mask.size} entries for {ids.size} input_ids")
    if not np.isin(mask, (0, 1)).all():
        raise MalformedRowError("loss_mask: values must be 0/1 or booleans")
    return ids.astype(np.int64).tolist(), mask.astype(bool).tolist(), True

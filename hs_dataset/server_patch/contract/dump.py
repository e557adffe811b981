"""What a per-request dump is: its file names, its metadata keys and the server's refusal reasons.

* ``{staging}/{rid}.safetensors``: tensors ``input_ids`` int64 ``[T]``,
  ``aux_hidden_states`` ``[T, K, H]`` (model dtype, K in ascending HF index order),
  ``final_hidden_state`` ``[T, H]`` (pre-norm); ``__metadata__`` with the keys of
  :data:`REQUIRED_METADATA`. With fp8 staging the states and their scales follow
  :mod:`hs_dataset.codecs.fp8`. The header is the one :mod:`hs_dataset.codecs.safetensors_header`
  builds, so the server writes the tensor bytes straight from host memory behind it.
* ``{staging}/{rid}.refused.json``: ``{"rid": ..., "reason": ...}`` -- the server saw the
  request but will not store it (partial prompt, staging full, wrong set-up...).
* ``{staging}/{rid}.{k}.safetensors`` (one-pass rids only, :func:`piece_name`): piece ``k`` of the rows
  the server computed for a one-pass generation request, in the tensors above plus ``positions``
  int64 ``[n]`` (each row's position in the request's sequence); rows of one piece need not be
  contiguous, and pieces may overlap (a retracted request is prefilled again). ``__metadata__``
  adds ``capture_path`` (``one_pass``) and ``piece``.
* Names starting with ``.`` are in-progress temporary files; readers ignore them.
"""

from __future__ import annotations

from hs_dataset.server_patch.contract.rid import validate_rid

__all__ = [
    "DUMP_FORMAT",
    "DUMP_SUFFIX",
    "DUMP_VERSION",
    "HOOKS_MODULE",
    "ONE_PASS_PATH",
    "REFUSED_NO_HOST_BUFFER",
    "REFUSED_STAGING_FULL",
    "REFUSED_SUFFIX",
    "REFUSED_WRITE_FAILED",
    "REQUIRED_METADATA",
    "RETRYABLE_REFUSALS",
    "TMP_PREFIX",
    "dump_name",
    "parse_piece_name",
    "piece_name",
    "piece_number",
    "refused_name",
]

# The module whose ``--forward-hooks`` factories write dumps: ``serve`` names it in the specs it writes, the client
# finds it in a server's ``/server_info`` (a string on both sides: neither imports the server side).
HOOKS_MODULE = "hs_dataset.server_patch.hooks"

DUMP_FORMAT = "hs_dataset.dump"
DUMP_VERSION = "1"
DUMP_SUFFIX = ".safetensors"
REFUSED_SUFFIX = ".refused.json"
TMP_PREFIX = ".tmp-"
# Refusals that may clear on their own, so the client retries them: each such reason starts with one of these.
REFUSED_STAGING_FULL = "staging full"
REFUSED_NO_HOST_BUFFER = "no host buffer of the capture pool freed up in time"
REFUSED_WRITE_FAILED = "server could not write the dump"
RETRYABLE_REFUSALS = (REFUSED_STAGING_FULL, REFUSED_NO_HOST_BUFFER, REFUSED_WRITE_FAILED)
REQUIRED_METADATA = ("format", "version", "rid", "hf_aux_layer_ids", "final_state", "sglang_version", "dtype")


def dump_name(rid: str) -> str:
    return validate_rid(rid) + DUMP_SUFFIX


ONE_PASS_PATH = "one_pass"  # a piece's capture_path
PIECE_DIGITS = 6


def piece_name(rid: str, k: int) -> str:
    """File name of piece ``k`` (0-based) of one-pass request ``rid``."""
    return f"{validate_rid(rid)}.{int(k):0{PIECE_DIGITS}d}{DUMP_SUFFIX}"


def parse_piece_name(name: str) -> tuple[str, int] | None:
    """``(rid, k)`` when ``name`` is a piece file name (:func:`piece_name`), else None (the rid itself is not validated)."""
    if not name.endswith(DUMP_SUFFIX):
        return None
    rid, dot, digits = name[: -len(DUMP_SUFFIX)].rpartition(".")
    return (rid, int(digits)) if dot and len(digits) == PIECE_DIGITS and digits.isdigit() else None


def piece_number(rid: str, name: str) -> int | None:
    """``k`` when ``name`` is a piece file of ``rid`` (:func:`piece_name`), else None."""
    parsed = parse_piece_name(name)
    return parsed[1] if parsed is not None and parsed[0] == rid else None


def refused_name(rid: str) -> str:
    return validate_rid(rid) + REFUSED_SUFFIX

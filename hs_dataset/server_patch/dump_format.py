"""The per-request dump contract between the server hook and the client (docs/SGLANG.md).

Stdlib only, so both sides (scheduler processes and the builder) share one definition.

* ``{staging}/{rid}.safetensors``: tensors ``input_ids`` int64 ``[T]``,
  ``aux_hidden_states`` ``[T, K, H]`` (model dtype, K in ascending HF index order),
  ``final_hidden_state`` ``[T, H]`` (pre-norm); ``__metadata__`` with the keys of
  :data:`REQUIRED_METADATA`.
* ``{staging}/{rid}.refused.json``: ``{"rid": ..., "reason": ...}`` -- the server saw the
  request but will not store it (partial prompt, staging full, wrong set-up...).
* Names starting with ``.`` are in-progress temporary files; readers ignore them.

Request ids are ``hs-<run>-<seq>-<T>``: ``<run>`` 1-32 of ``[a-z0-9]``, ``<seq>`` a
request counter, ``<T>`` the prompt's token count (the server needs it to know when a
chunked prefill is complete). :func:`validate_rid` is the one gate before a rid is used
in a file name.
"""

from __future__ import annotations

import re

__all__ = [
    "DUMP_FORMAT",
    "DUMP_VERSION",
    "DUMP_SUFFIX",
    "REFUSED_SUFFIX",
    "TMP_PREFIX",
    "RID_RE",
    "REQUIRED_METADATA",
    "validate_rid",
    "make_rid",
    "rid_num_tokens",
    "dump_name",
    "refused_name",
]

DUMP_FORMAT = "hs_dataset.dump"
DUMP_VERSION = "1"
DUMP_SUFFIX = ".safetensors"
REFUSED_SUFFIX = ".refused.json"
TMP_PREFIX = ".tmp-"
REQUIRED_METADATA = ("format", "version", "rid", "hf_aux_layer_ids", "final_state", "sglang_version", "dtype")

RID_RE = re.compile(r"\Ahs-(?P<run>[a-z0-9]{1,32})-(?P<seq>[0-9]{1,12})-(?P<tokens>[1-9][0-9]{0,8})\Z")
_RUN_RE = re.compile(r"\A[a-z0-9]{1,32}\Z")


def validate_rid(rid: object) -> str:
    """Return ``rid`` if it is one of ours and safe as a file name; raise ``ValueError`` otherwise."""
    if not isinstance(rid, str) or RID_RE.match(rid) is None:
        raise ValueError(f"not a valid hs_dataset request id: {rid!r} (expected hs-<run>-<seq>-<tokens>)")
    return rid


def make_rid(run: str, seq: int, num_tokens: int) -> str:
    if not _RUN_RE.match(run):
        raise ValueError(f"run id must be 1-32 characters of [a-z0-9], got {run!r}")
    return validate_rid(f"hs-{run}-{int(seq)}-{int(num_tokens)}")


def rid_num_tokens(rid: str) -> int:
    """The prompt length encoded in a valid rid."""
    m = RID_RE.match(rid)
    if m is None:
        raise ValueError(f"not a valid hs_dataset request id: {rid!r}")
    return int(m.group("tokens"))


def dump_name(rid: str) -> str:
    return validate_rid(rid) + DUMP_SUFFIX


def refused_name(rid: str) -> str:
    return validate_rid(rid) + REFUSED_SUFFIX

"""What a per-request dump is: its file names, its metadata keys and the server's refusal reasons.

* ``{staging}/{rid}.safetensors``: tensors ``input_ids`` int64 ``[T]``,
  ``aux_hidden_states`` ``[T, K, H]`` (model dtype, K in ascending HF index order),
  ``final_hidden_state`` ``[T, H]`` (pre-norm); ``__metadata__`` with the keys of
  :data:`REQUIRED_METADATA`. With fp8 staging the states and their scales follow
  :mod:`hs_dataset.codecs.fp8`. The header is the one :mod:`hs_dataset.codecs.safetensors_header`
  builds, so the server writes the tensor bytes straight from host memory behind it.
* ``{staging}/{rid}.refused.json``: ``{"rid": ..., "reason": ...}`` -- the server saw the
  request but will not store it (partial prompt, staging full, wrong set-up...).
* Names starting with ``.`` are in-progress temporary files; readers ignore them.
"""

from __future__ import annotations

from hs_dataset.server_patch.contract.rid import validate_rid

__all__ = [
    "DUMP_FORMAT",
    "DUMP_SUFFIX",
    "DUMP_VERSION",
    "HOOKS_MODULE",
    "REFUSED_NO_HOST_BUFFER",
    "REFUSED_STAGING_FULL",
    "REFUSED_SUFFIX",
    "REFUSED_WRITE_FAILED",
    "REQUIRED_METADATA",
    "RETRYABLE_REFUSALS",
    "TMP_PREFIX",
    "dump_name",
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


def refused_name(rid: str) -> str:
    return validate_rid(rid) + REFUSED_SUFFIX

"""Names and constants of the shard layout shared by the writer, reader and verify (docs/FORMAT.md)."""

from __future__ import annotations

import re

__all__ = [
    "AUX_KEY",
    "CAPTURE_PATHS_KEY",
    "DEFAULT_SHARD_BYTES",
    "FINAL_KEY",
    "INPUT_IDS_KEY",
    "LOSS_MASK_KEY",
    "NORM_WEIGHT_FILE",
    "NORM_WEIGHT_KEY",
    "OFFSETS_KEY",
    "SHARD_FORMAT",
    "SHARD_NAME_RE",
    "SHARD_SUFFIX",
    "STATE_KEYS",
    "shard_file_name",
    "state_keys",
]

SHARD_FORMAT = "hs_dataset.shard"
SHARD_SUFFIX = ".safetensors"
OFFSETS_KEY = "sample_offsets"
INPUT_IDS_KEY = "input_ids"
LOSS_MASK_KEY = "loss_mask"
AUX_KEY = "aux_hidden_states"
FINAL_KEY = "final_hidden_state"
# header metadata: a JSON list beside sample_ids, how each sample was captured ("one_pass", "prefill"; absent: one way only)
CAPTURE_PATHS_KEY = "capture_paths"
STATE_KEYS = (AUX_KEY, FINAL_KEY)
NORM_WEIGHT_FILE = "final_norm.safetensors"
NORM_WEIGHT_KEY = "weight"

DEFAULT_SHARD_BYTES = 2 * 1024**3

SHARD_NAME_RE = re.compile(r"^(?P<prefix>[A-Za-z0-9_.-]*?)shard-(?P<seq>\d{6})\.safetensors$")


def shard_file_name(prefix: str, seq: int) -> str:
    """``{prefix}shard-000042.safetensors``; the prefix separates concurrent writers (ranks)."""
    return f"{prefix}shard-{seq:06d}{SHARD_SUFFIX}"


def state_keys(num_aux: int) -> tuple[str, ...]:
    """The state tensors a shard holds: both, or only the final state when no aux layer is captured (an MTP dataset)."""
    return STATE_KEYS if num_aux else (FINAL_KEY,)

"""A model's ``config.json``, read within bounds and checked before anything is sized from it.

The layer count decides how many aux ids exist and how many decoder layers a build
allocates; the hidden size and vocabulary decide tensor shapes. A config that is
truncated, not a file we may read, or holds ``hidden_size: -64``,
``num_hidden_layers: "six"`` or a billion layers must be refused here, in one line
naming the file, the field and the fix, not discovered as a traceback or an
out-of-memory kill minutes later. The ranges are wide enough for every published
model (Kimi-K2.5: 61 layers, hidden 7168, vocabulary 163840) and far below sizes
that would exhaust a host.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hs_dataset.errors import ModelConfigError

__all__ = [
    "FIELD_RANGES",
    "FLOAT_RANGES",
    "KIND_FIELDS",
    "MAX_CONFIG_BYTES",
    "check_text_config",
    "load_text_config",
    "read_model_config",
    "text_config",
]

MAX_CONFIG_BYTES = 4 * 1024 * 1024  # real config.json files are a few kilobytes
# field -> (lowest, highest, required): integers, checked on the text model's config
FIELD_RANGES: dict[str, tuple[int, int, bool]] = {
    "num_hidden_layers": (1, 1024, True),
    "hidden_size": (1, 131_072, True),
    "vocab_size": (1, 16_777_216, False),
    "num_attention_heads": (1, 8192, False),
    "num_key_value_heads": (1, 8192, False),
    "intermediate_size": (1, 1_048_576, False),
    "max_position_embeddings": (1, 1 << 28, False),
    # the other sizes the model code builds tensors from (null where a config may leave them unset)
    "head_dim": (1, 65_536, False),
    "q_lora_rank": (1, 1_048_576, False),
    "kv_lora_rank": (1, 1_048_576, False),
    "qk_nope_head_dim": (0, 65_536, False),
    "qk_rope_head_dim": (0, 65_536, False),
    "v_head_dim": (1, 65_536, False),
    "moe_intermediate_size": (1, 1_048_576, False),
    "shared_expert_intermediate_size": (1, 1_048_576, False),
    "n_routed_experts": (1, 65_536, False),
    "num_experts": (1, 65_536, False),
    "num_local_experts": (1, 65_536, False),
    "n_shared_experts": (0, 65_536, False),
    "num_experts_per_tok": (1, 65_536, False),
    "n_group": (1, 65_536, False),
    "topk_group": (1, 65_536, False),
    "first_k_dense_replace": (0, 1024, False),
    "moe_layer_freq": (1, 1024, False),
    "num_nextn_predict_layers": (0, 64, False),
    "sliding_window": (1, 1 << 28, False),
}
# field -> (lowest, highest): numbers (integers accepted), finite, checked the same way; none is required
FLOAT_RANGES: dict[str, tuple[float, float]] = {
    "rms_norm_eps": (1e-30, 1.0),
    "layer_norm_eps": (1e-30, 1.0),
    "layer_norm_epsilon": (1e-30, 1.0),
    "rope_theta": (1e-30, 1e15),
    "routed_scaling_factor": (1e-30, 1e6),
    "attention_dropout": (0.0, 1.0),
    "initializer_range": (0.0, 1e3),
}
# field -> the JSON types it must have when present (what decides which code runs, or whether a tensor exists)
KIND_FIELDS: dict[str, tuple[type, ...]] = {
    "model_type": (str,),
    "architectures": (list,),
    "hidden_act": (str,),
    "tie_word_embeddings": (bool,),
    "attention_bias": (bool,),
    "mlp_bias": (bool,),
    "norm_topk_prob": (bool,),
    "scoring_func": (str,),
    "topk_method": (str,),
    "rope_scaling": (dict,),
    "rope_parameters": (dict,),
    "auto_map": (dict,),
    "quantization_config": (dict,),
}


def text_config(config: Any) -> Any:
    """The one text-config lookup: the decoder's config inside a model config.

    Multimodal wrappers (Kimi-K2.5, ``model_type: kimi_k25``) keep the DeepseekV3
    text model's config under ``text_config``; plain models are their own text
    config. Works on a ``config.json`` mapping and on a transformers config object.
    """
    if isinstance(config, Mapping):
        inner = config.get("text_config")
        return inner if isinstance(inner, Mapping) and inner else config
    return getattr(config, "text_config", None) or config


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ModelConfigError(
            f"{path}: cannot read the model config ({exc.strerror or exc}); fix the file (or the symlink to it) and its permissions"
        ) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ModelConfigError(f"{path}: over {MAX_CONFIG_BYTES} bytes, not a model config; use the snapshot's own config.json")
    try:
        config = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ModelConfigError(f"{path}: not UTF-8 JSON (byte {exc.start}); use the snapshot's own config.json") from None
    except json.JSONDecodeError as exc:
        raise ModelConfigError(
            f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); the file may be truncated: download it again"
        ) from None
    except RecursionError:
        raise ModelConfigError(f"{path}: nested too deeply to be a model config; use the snapshot's own config.json") from None
    if not isinstance(config, dict):
        raise ModelConfigError(f"{path}: must hold a JSON object, got a {type(config).__name__}")
    return config


def check_text_config(text: Any, where: str) -> None:
    """Refuse a text config whose sizing fields are missing, not integers or out of range (one line each)."""
    if not isinstance(text, dict):
        raise ModelConfigError(f"{where}: text_config must be an object, got a {type(text).__name__}")
    for name, (low, high, required) in FIELD_RANGES.items():
        value = text.get(name)
        if value is None:
            if required:
                raise ModelConfigError(f"{where}: {name} is missing; a decoder config needs it (use the snapshot's own config.json)")
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise ModelConfigError(f"{where}: {name} must be an integer in [{low}, {high}], got {type(value).__name__} {value!r:.40}")
        if not low <= value <= high:
            raise ModelConfigError(
                f"{where}: {name} is {value}, outside [{low}, {high}]; fix the value (or use the snapshot's own config.json)"
            )
    _check_floats(text, where)
    _check_kinds(text, where)


def _check_floats(text: dict[str, Any], where: str) -> None:
    for name, (low, high) in FLOAT_RANGES.items():
        value = text.get(name)
        if value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ModelConfigError(f"{where}: {name} must be a number in [{low:g}, {high:g}], got {type(value).__name__} {value!r:.40}")
        if not (math.isfinite(value) and low <= value <= high):
            raise ModelConfigError(
                f"{where}: {name} is {value!r}, outside [{low:g}, {high:g}]; fix the value (or use the snapshot's own config.json)"
            )


def _check_kinds(text: dict[str, Any], where: str) -> None:
    for name, types in KIND_FIELDS.items():
        value = text.get(name)
        if value is not None and not isinstance(value, types):
            kinds = " or ".join("an object" if t is dict else ("a list" if t is list else f"a {t.__name__}") for t in types)
            raise ModelConfigError(
                f"{where}: {name} must be {kinds}, got {type(value).__name__} {value!r:.40}; use the snapshot's own config.json"
            )
    names = text.get("architectures") or []
    if not all(isinstance(n, str) for n in names):
        raise ModelConfigError(f"{where}: architectures must be a list of class names, got {names!r:.60}")


def read_model_config(directory: str | os.PathLike) -> dict[str, Any]:
    """The ``config.json`` of the model in ``directory``, its text model's sizes checked (:class:`ModelConfigError`)."""
    path = Path(directory) / "config.json"
    config = _read(path)
    check_text_config(text_config(config), str(path))
    return config


def load_text_config(directory: str | os.PathLike) -> dict[str, Any]:
    """The text config of the model in ``directory`` (its ``config.json``, checked), as a dict."""
    return dict(text_config(read_model_config(directory)))

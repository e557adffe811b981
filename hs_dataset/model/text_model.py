"""Load the model whose states are captured: the causal LM itself, or the text model inside a multimodal wrapper.

Kimi-K2.5 (``KimiK25ForConditionalGeneration``) wraps a DeepseekV3 text model
(``text_config``; weights ``language_model.model.*``, ``language_model.lm_head.*``)
next to a vision tower. EAGLE-3 states come from the text model only, so for a
wrapper we build transformers' own class for ``text_config`` and load just the
tensors under the text model's prefix: no vision weights in memory, and no shipped
modeling code executed (the wrapper's remote code is not needed for text capture).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from hs_dataset.model.model_config import read_model_config, text_config
from hs_dataset.model.remote_code import from_pretrained_kwargs

__all__ = ["is_wrapper", "text_weight_prefix", "load_causal_lm", "loaded_module_path"]

_EMBED_SUFFIX = "model.embed_tokens.weight"
# Text model types of wrappers that transformers knows under another name
# (Kimi-K2.5's text_config says kimi_k2; transformers' own Kimi_K25Config maps it the same way).
_TEXT_MODEL_TYPES = {"kimi_k2": "deepseek_v3"}


def is_wrapper(config: dict[str, Any]) -> bool:
    """True for a config.json whose text model lives under ``text_config`` (a multimodal wrapper)."""
    return text_config(config) is not config


def _weight_names(directory: Path) -> list[str]:
    index = directory / "model.safetensors.index.json"
    if index.exists():
        return list(json.loads(index.read_text())["weight_map"])
    from safetensors import safe_open

    names: list[str] = []
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            names.extend(f.keys())
    return names


def text_weight_prefix(directory: str | os.PathLike) -> str:
    """The prefix of the text model's weights (``language_model.`` for Kimi-K2.5), from the embedding's name."""
    for name in _weight_names(Path(directory)):
        if name.endswith(_EMBED_SUFFIX) and "vision" not in name:
            return name[: -len(_EMBED_SUFFIX)]
    raise ValueError(f"{directory}: no weight named '*{_EMBED_SUFFIX}' (the text model's embedding); set model.text_module in the card")


def _load_text_of_wrapper(directory: Path, config: dict[str, Any], dtype: Any) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    text = dict(text_config(config))
    model_type = text.pop("model_type", "deepseek_v3")
    text_cfg = AutoConfig.for_model(_TEXT_MODEL_TYPES.get(model_type, model_type), **text)
    prefix = text_weight_prefix(directory)
    # transformers' own loading (fused experts, dtype), with the wrapper's prefix mapped away;
    # weights outside it (the vision tower) are left unread.
    return AutoModelForCausalLM.from_pretrained(
        directory, config=text_cfg, dtype=dtype, key_mapping={f"^{re.escape(prefix)}": ""}, local_files_only=True
    )


def load_causal_lm(directory: str | os.PathLike, *, dtype: Any, trust_remote_code: bool = False) -> Any:
    """The causal LM of the snapshot in ``directory`` (the text model of a wrapper), in ``dtype``, offline."""
    from transformers import AutoModelForCausalLM

    directory = Path(directory)
    config = read_model_config(directory)  # sizes checked before transformers allocates from them
    if is_wrapper(config):
        return _load_text_of_wrapper(directory, config, dtype)
    return AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, **from_pretrained_kwargs(directory, trust_remote_code))


def loaded_module_path(directory: str | os.PathLike, text_module: str | None) -> str | None:
    """``text_module`` as seen from what :func:`load_causal_lm` returns.

    The card names the decoder inside the served wrapper (``language_model.model``);
    a wrapper's text model is loaded alone, so its own prefix is dropped (``model``).
    """
    directory = Path(directory)
    if not text_module or not is_wrapper(read_model_config(directory)):
        return text_module
    prefix = text_weight_prefix(directory)
    return text_module[len(prefix) :] if prefix and text_module.startswith(prefix) else text_module

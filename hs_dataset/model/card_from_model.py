"""A card derived from the model itself, so any local snapshot can be captured without writing one.

Everything a card needs that the model already says is read from it: the layer
count (for the EAGLE-3 default aux layers, unless a drafter family's preset is
asked for), the hidden size, the dtype, where the text model sits inside a multimodal wrapper, and the tokenizer's own chat template
(the card's ``model.chat_template`` stays null). The rest are the card defaults.
``hs-dataset card init`` writes the same card as YAML, so a derived build and a
build from the written card are the same build.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from hs_dataset.config import Card, card_from_dict, load_card
from hs_dataset.dtypes import STATE_DTYPES
from hs_dataset.layer_presets import eagle3_default_aux_layers
from hs_dataset.model.model_config import read_model_config, text_config
from hs_dataset.model.snapshot import resolve_model_path
from hs_dataset.model.text_model import is_wrapper, text_weight_prefix
from hs_dataset.model.weights import check_weights

__all__ = ["card_from_model", "model_card_dict"]

BackendName = Literal["hf", "sglang"]
_CPU_SERVER_CARD = "tiny-deepseek-sglang"  # the shipped CPU server recipe (SGLang flags and env that work on CPU)


def _dtype(text: dict[str, Any], config: dict[str, Any]) -> str:
    """The checkpoint's dtype when hs_dataset can store it, else bfloat16 (e.g. fp8/int4 weights compute in bf16)."""
    named = text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or config.get("dtype")
    return named if named in STATE_DTYPES else "bfloat16"


def _card_name(model: str) -> str:
    stem = Path(model.rstrip("/")).name or "model"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-._") or "model"


def _server_section(text_module: str | None) -> dict[str, Any]:
    """``hs-dataset serve`` settings: the shipped CPU recipe on a machine without CUDA, SGLang's defaults on GPUs."""
    import torch

    if torch.cuda.is_available():
        return {"device": "cuda", "module_path": text_module}
    cpu = load_card(_CPU_SERVER_CARD).sglang.model_dump(mode="json")
    return {**cpu, "python": None, "module_path": text_module}


def model_card_dict(
    model: str,
    *,
    backend: BackendName = "hf",
    servers: list[str] | None = None,
    trust_remote_code: bool = False,
    revision: str | None = None,
    preset: str | None = None,
    taps: int | None = None,
) -> dict[str, Any]:
    """The card of ``model`` (a directory, a Hub id in the local cache, or ``builtin:NAME``) as a mapping.

    ``preset`` (``layers.preset``, with ``taps`` for the DFlash family) leaves the ids to the
    capture; without it the card names the EAGLE-3 default layers.
    """
    directory = resolve_model_path(model, revision=revision)
    config = read_model_config(directory)
    check_weights(directory, config)  # a card is never derived from a config its weights do not match
    text = dict(text_config(config))
    layers = int(text["num_hidden_layers"])
    text_module = f"{text_weight_prefix(directory)}model" if is_wrapper(config) else None
    architecture = (config.get("architectures") or ["?"])[0]
    raw: dict[str, Any] = {
        "name": _card_name(model),
        "description": f"Derived from {model} ({architecture}: {layers} layers, hidden {text['hidden_size']}); "
        f"{f'the {preset} layer preset' if preset else 'EAGLE-3 default aux layers'}, pre-norm final state, the tokenizer's own chat template.",
        "model": {"path": model, "revision": revision, "text_module": text_module, "trust_remote_code": trust_remote_code},
        "layers": {"preset": preset, "taps": taps, "final": "pre_norm"}
        if preset
        else {"aux": eagle3_default_aux_layers(layers), "final": "pre_norm"},
        "dtype": _dtype(text, config),
        "max_length": min(4096, int(text.get("max_position_embeddings") or 4096)),
        "source": {"path": "builtin:conversations"},
        "backend": {"name": "hf"} if backend == "hf" else {"name": "sglang", "urls": list(servers or [])},
    }
    if backend == "sglang":
        raw["sglang"] = _server_section(text_module)
    return raw


def card_from_model(model: str, **options: Any) -> Card:
    """The validated card of ``model`` (see :func:`model_card_dict` for the options)."""
    return card_from_dict(model_card_dict(model, **options), where=f"card derived from {model}")

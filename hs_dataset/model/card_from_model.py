"""A card derived from the model itself, so any local snapshot can be captured without writing one.

Everything a card needs that the model already says is read from it: the layer
count (for the EAGLE-3 default aux layers), the hidden size, the dtype, where the
text model sits inside a multimodal wrapper, and the tokenizer's own chat template
(the card's ``model.chat_template`` stays null). The rest are the card defaults.
``hs-dataset card init`` writes the same card as YAML, so a derived build and a
build from the written card are the same build.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from hs_dataset.model.model_config import read_model_config, text_config
from hs_dataset.model.snapshot import resolve_model_path
from hs_dataset.model.text_model import is_wrapper, text_weight_prefix
from hs_dataset.model.weights import check_weights
from hs_dataset.config import Card, card_from_dict, load_card
from hs_dataset.dtypes import STATE_DTYPES

__all__ = ["eagle3_default_aux_layers", "card_from_model", "model_card_dict"]

BackendName = Literal["hf", "sglang"]
_CPU_SERVER_CARD = "tiny-deepseek-sglang"  # the shipped CPU server recipe (SGLang flags and env that work on CPU)


def eagle3_default_aux_layers(num_layers: int) -> list[int]:
    """The EAGLE-3 default aux layers as HF ``hidden_states`` indexes: ``[2, L // 2, L - 3]``.

    Both trainers agree once their index conventions are aligned:

    * speculators 0.9 (``speculators/models/utils.py`` ``resolve_target_layer_ids``)
      defaults to ``[2, L // 2, L - 3]`` in vLLM's convention, where id ``i`` is the
      residual stream *entering* decoder layer ``i`` = the output of layer ``i - 1`` =
      HF ``hidden_states[i]`` (it also accepts ``L``, the final state, as HF does).
    * SpecForge 0.2 (``specforge/algorithms/model_providers.py``
      ``resolve_eagle_capture_layers``) defaults to ``[1, L // 2 - 1, L - 4]`` in
      SGLang's convention, where id ``i`` is the *output* of decoder layer ``i``
      (SGLang captures before layer ``i + 1``) = HF ``hidden_states[i + 1]``: the same
      ``[2, L // 2, L - 3]`` after the +1 shift.

    Kimi-K2.5 (61 layers): ``[2, 30, 58]``. Small test models, where the rule's ids
    collide (6 layers: ``[2, 3, 3]``), get each repeat moved one layer up
    (``[2, 3, 4]``); models too small for three ids get ``[0, .., L - 1]``.
    """
    if num_layers < 1:
        raise ValueError(f"a model needs at least one decoder layer, got num_hidden_layers={num_layers}")
    ids: list[int] = []
    for wanted in sorted(max(0, i) for i in (2, num_layers // 2, num_layers - 3)):
        ids.append(max(wanted, ids[-1] + 1) if ids else wanted)
    return ids if ids[-1] < num_layers else list(range(num_layers))


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
) -> dict[str, Any]:
    """The card of ``model`` (a directory, a Hub id in the local cache, or ``builtin:NAME``) as a mapping."""
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
        "EAGLE-3 default aux layers, pre-norm final state, the tokenizer's own chat template.",
        "model": {"path": model, "revision": revision, "text_module": text_module, "trust_remote_code": trust_remote_code},
        "layers": {"aux": eagle3_default_aux_layers(layers), "final": "pre_norm"},
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

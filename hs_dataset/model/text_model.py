"""Load the model whose states are captured: the causal LM itself, or the text model inside a multimodal wrapper.

Kimi-K2.5 (``KimiK25ForConditionalGeneration``) wraps a DeepseekV3 text model
(``text_config``; weights ``language_model.model.*``, ``language_model.lm_head.*``)
next to a vision tower. EAGLE-3 states come from the text model only, so for a
wrapper we build transformers' own class for ``text_config`` and load just the
tensors under the text model's prefix: no vision weights in memory, and no shipped
modeling code executed (the wrapper's remote code is not needed for text capture).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from hs_dataset.errors import ModelConfigError
from hs_dataset.model.model_config import read_model_config, text_config
from hs_dataset.model.remote_code import from_pretrained_kwargs
from hs_dataset.model.weights import check_weights, text_prefix, weight_shapes

__all__ = ["is_wrapper", "load_causal_lm", "loaded_module_path", "text_weight_prefix"]

# Text model types of wrappers that transformers knows under another name
# (Kimi-K2.5's text_config says kimi_k2; transformers' own Kimi_K25Config maps it the same way).
_TEXT_MODEL_TYPES = {"kimi_k2": "deepseek_v3"}
_SHOWN_KEYS = 3  # keys named in a refusal; the count says how many more


def is_wrapper(config: dict[str, Any]) -> bool:
    """True for a config.json whose text model lives under ``text_config`` (a multimodal wrapper)."""
    return text_config(config) is not config


def text_weight_prefix(directory: str | os.PathLike) -> str:
    """The prefix of the text model's weights (``language_model.`` for Kimi-K2.5), from the embedding's name."""
    return text_prefix(weight_shapes(directory), str(directory))


def _built(directory: Path, what: str, build: Any) -> Any:
    """What ``build()`` returns, or one line naming why transformers refuses ``config.json`` (an unknown
    ``model_type``, a field of the wrong type its own validation catches, an activation it has no function for)."""
    try:
        return build()
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, RuntimeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelConfigError(
            f"{directory / 'config.json'}: transformers cannot build the {what} from it ({type(exc).__name__}: {first[:300]}); "
            "use the snapshot's own config.json, or a transformers that knows its model_type"
        ) from None


def _load_text_of_wrapper(directory: Path, config: dict[str, Any], dtype: Any) -> tuple[Any, dict[str, Any]]:
    from transformers import AutoConfig, AutoModelForCausalLM

    text = dict(text_config(config))
    model_type = text.pop("model_type", "deepseek_v3")
    text_cfg = _built(directory, "model config", lambda: AutoConfig.for_model(_TEXT_MODEL_TYPES.get(model_type, model_type), **text))
    prefix = text_weight_prefix(directory)
    # transformers' own loading (fused experts, dtype), with the wrapper's prefix mapped away;
    # weights outside it (the vision tower) are left unread.
    model, info = _built(
        directory,
        "model",
        lambda: AutoModelForCausalLM.from_pretrained(
            directory,
            config=text_cfg,
            dtype=dtype,
            key_mapping={f"^{re.escape(prefix)}": ""},
            local_files_only=True,
            output_loading_info=True,
            ignore_mismatched_sizes=True,
        ),
    )
    return model, info


def _refuse_loading_problems(directory: Path, info: dict[str, Any]) -> None:
    """Weights the model lacks (they would stay random), weights it does not know, or shapes that differ: one line each.

    Unexpected weights outside the text model's own names (``model.``, ``lm_head.``) are other parts'
    (a wrapper's vision tower and projector, a multi-token-prediction head's ``mtp.*``): not the text
    model's to load. A checkpoint of another naming altogether still fails, on its missing weights.
    """
    info = {**info, "unexpected_keys": [k for k in info.get("unexpected_keys") or () if str(k).startswith(("model.", "lm_head."))]}
    for kind, what in (
        ("missing_keys", "missing weights (they would run from random numbers)"),
        ("unexpected_keys", "unexpected weights (the config builds no place for them)"),
        ("mismatched_keys", "weights whose shapes the config does not make"),
    ):
        keys = sorted(str(k if isinstance(k, str) else k[0]) for k in info.get(kind) or ())
        if keys:
            more = f" and {len(keys) - _SHOWN_KEYS} more" if len(keys) > _SHOWN_KEYS else ""
            raise ModelConfigError(
                f"{directory}: {what}: {', '.join(keys[:_SHOWN_KEYS])}{more}; use the snapshot's own config.json (or download the weights again)"
            )


def load_causal_lm(directory: str | os.PathLike, *, dtype: Any, trust_remote_code: bool = False) -> Any:
    """The causal LM of the snapshot in ``directory`` (the text model of a wrapper), in ``dtype``, offline.

    Before anything is allocated, the config's sizes are checked against the weights'
    headers (:func:`~hs_dataset.model.weights.check_weights`); after loading, any weight
    transformers reports missing, unexpected or of another shape is refused, so no forward
    runs with layers made of random numbers.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    directory = Path(directory)
    config = read_model_config(directory)  # sizes checked before transformers allocates from them
    check_weights(directory, config)
    if is_wrapper(config):
        model, info = _load_text_of_wrapper(directory, config, dtype)
    else:
        kwargs = from_pretrained_kwargs(directory, trust_remote_code)
        built = _built(directory, "model config", lambda: AutoConfig.from_pretrained(directory, **kwargs))
        model, info = _built(
            directory,
            "model",
            lambda: AutoModelForCausalLM.from_pretrained(
                directory, config=built, dtype=dtype, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs
            ),
        )
    _refuse_loading_problems(directory, info)
    return model


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

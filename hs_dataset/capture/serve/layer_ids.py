"""Layer ids: our HF ``hidden_states`` indexes <-> what SGLang is asked for (both sides, stdlib only)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from hs_dataset.errors import HsDatasetError

__all__ = ["SHIFT_RULES", "LayerIdError", "captured_hf_ids", "layer_hook_targets", "model_family", "sglang_eagle3_ids", "validate_hf_ids"]

# ---------------------------------------------------------------- layer ids: HF hidden_states <-> SGLang
# Translate our aux layer ids (HF ``hidden_states`` indexes) into what SGLang needs.
#
# Runs on both sides (client, ``hs-dataset serve``, scheduler processes): stdlib only.
#
# Our convention (the dataset's): aux id ``i`` is transformers'
# ``output_hidden_states[i]`` -- ``0`` is the embedding output and ``i >= 1`` the output
# of decoder layer ``i - 1`` (the pre-norm residual stream entering layer ``i``). The
# last entry of transformers' tuple, ``hidden_states[N]``, is *post*-norm and is not an
# aux id here: the final state is captured separately (pre-norm).
#
# SGLang captures "at layer ``c``" = the stream entering layer ``c`` = HF index ``c``.
# What its ``set_eagle3_layers_to_capture`` does with the ids it is given is read from the
# installed source (``capture/serve/facts.py``), per model family, as a *shift rule*:
#
# * ``always``: ``+1`` to every id (Llama / Qwen on every release read; DeepseekV2 up to 0.5.9);
# * ``first_is_one``: ``+1`` only when the first id is 1, ids as given otherwise
#   (DeepseekV2/V3, Kimi-K2/K2.5, from 0.5.14 at least).
#
# So some HF indexes cannot be asked for under some rules (a first id of 1 under
# ``first_is_one``, id 0 under ``always``); those raise :class:`LayerIdError` with the
# reason, instead of silently capturing a neighbour.

SHIFT_RULES = ("always", "first_is_one")


_DEEPSEEK_ARCHS = {
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM",
    "KimiK25ForConditionalGeneration",
}
_SHIFT_ALWAYS_ARCHS_PREFIXES = ("Llama", "Qwen2", "Qwen3", "Mistral")


class LayerIdError(HsDatasetError, ValueError):
    """An aux layer id cannot be captured on this model / SGLang version."""


def model_family(architectures: Sequence[str] | str | None) -> str:
    """``"deepseek"``, ``"llama"`` (the always-+1 family) or ``"unknown"``."""
    if isinstance(architectures, str):
        architectures = [architectures]
    for arch in architectures or ():
        if arch in _DEEPSEEK_ARCHS:
            return "deepseek"
        if arch.startswith(_SHIFT_ALWAYS_ARCHS_PREFIXES):
            return "llama"
    return "unknown"


def validate_hf_ids(hf_ids: Iterable[int], num_hidden_layers: int) -> list[int]:
    """Check ids are ints, strictly ascending, and within ``[0, num_hidden_layers - 1]`` (none: the final state only)."""
    ids = list(hf_ids)
    if not ids:
        return ids
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            raise LayerIdError(f"aux layer ids must be integers, got {ids!r}")
    if any(b <= a for a, b in itertools.pairwise(ids)):
        raise LayerIdError(f"aux layer ids must be strictly ascending, got {ids}")
    if ids[0] < 0:
        raise LayerIdError(f"aux layer ids must be >= 0, got {ids}")
    if ids[-1] > num_hidden_layers - 1:
        raise LayerIdError(
            f"aux layer id {ids[-1]} is out of range for a model with {num_hidden_layers} decoder layers: "
            f"HF hidden_states[{num_hidden_layers}] is the post-norm final state, and SGLang can only capture "
            f"the stream entering a layer (ids 0..{num_hidden_layers - 1})"
        )
    return ids


def _family(architectures: Sequence[str] | str, shift: str) -> str:
    family = model_family(architectures)
    if family == "unknown":
        raise LayerIdError(
            f"no known SGLang layer-id convention for architectures {architectures!r}; "
            "supported: DeepseekV2/V3, Kimi-K2/K2.5, Llama, Qwen2/3"
        )
    if shift not in SHIFT_RULES:
        raise LayerIdError(
            f"cannot tell what the installed SGLang's set_eagle3_layers_to_capture does to {family} layer ids "
            f"(read {shift!r} from its source); use mechanism 'layer_hooks', which passes no ids to SGLang"
        )
    return family


def sglang_eagle3_ids(hf_ids: Sequence[int], architectures: Sequence[str] | str, shift: str, num_hidden_layers: int) -> list[int]:
    """The ``--return-aux-hidden-state-layer-ids`` (EAGLE3 convention) that capture ``hf_ids`` under ``shift``.

    Raises :class:`LayerIdError` when no argument captures exactly those indexes.
    """
    ids = validate_hf_ids(hf_ids, num_hidden_layers)
    family = _family(architectures, shift)
    if shift == "first_is_one":
        if ids[0] == 1:
            raise LayerIdError(
                f"HF aux ids {ids} start with 1: the installed SGLang adds 1 to every {family} id when the first is 1 "
                "(giving hidden_states[2]...) and uses ids as given otherwise, so hidden_states[1] cannot be the "
                "first aux layer; choose another first layer (e.g. 0 or 2)"
            )
        return list(ids)  # passed as given (a first id of 2 is kept; passing 1, ... would also give 2, ...)
    if ids[0] == 0:
        raise LayerIdError(
            f"HF aux id 0 (the embedding output) cannot be captured on {family}: the installed SGLang adds 1 to every EAGLE3 layer id"
        )
    return [i - 1 for i in ids]


def captured_hf_ids(sglang_ids: Sequence[int], architectures: Sequence[str] | str, shift: str) -> list[int]:
    """Inverse of :func:`sglang_eagle3_ids`: which HF indexes SGLang captures for ``sglang_ids`` under ``shift``."""
    _family(architectures, shift)
    ids = list(sglang_ids)
    if shift == "first_is_one":
        return [i + 1 for i in ids] if ids and ids[0] == 1 else ids
    return [i + 1 for i in ids]


def layer_hook_targets(hf_ids: Sequence[int], module_path: str, num_hidden_layers: int) -> dict[str, int]:
    """Module names whose forward-hook output is HF ``hidden_states[i]``, for the layer-hook mechanism.

    ``hidden_states[0]`` is the output of ``{module_path}.embed_tokens``; ``hidden_states[i]``
    (``i >= 1``) the output of ``{module_path}.layers.{i-1}`` (with its residual added back
    when the layer returns ``(hidden, residual)``).
    """
    ids = validate_hf_ids(hf_ids, num_hidden_layers)
    targets: dict[str, int] = {}
    for i in ids:
        name = f"{module_path}.embed_tokens" if i == 0 else f"{module_path}.layers.{i - 1}"
        targets[name] = i
    return targets

"""``layer_hooks`` on the server: hooks on the decoder layers record ``hidden + residual`` (SGLang 0.5.9 - 0.5.19).

Valid only where a layer's output is a complete sum and the layer still returns its
residual: :func:`check_layer_outputs` reads the loaded decoder class's ``forward``
(:func:`~hs_dataset.server_patch.contract.layer_outputs.layer_hooks_problem`) when the first
layer hook loads, and token-scattering set-ups (DP attention, a2a MoE) are refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hs_dataset.server_patch import compat
from hs_dataset.server_patch.contract.layer_outputs import layer_hooks_problem
from hs_dataset.server_patch.contract.mechanism import Mechanism
from hs_dataset.server_patch.mechanisms.base import PassCapture, ServerMechanism, scattering_problems
from hs_dataset.server_patch.setup_error import SetupError

__all__ = ["LayerHooks", "check_layer_outputs"]


class LayerHooks(ServerMechanism):
    mechanism = Mechanism.LAYER_HOOKS
    takes_layer_hooks = True

    def server_problems(self, args: Any) -> list[str]:
        return scattering_problems(args)

    def aux_states(self, output: Any, taken: PassCapture, hf_aux_layer_ids: Sequence[int]) -> tuple[Any, str | None]:
        """The buffer the layer hooks filled, once every wanted layer wrote into it in this pass."""
        lost = [i for i in hf_aux_layer_ids if i not in taken.layers]
        if not lost:
            return taken.packed, None
        return None, taken.layer_problem or (
            f"the layer hooks for HF hidden_states {lost} recorded nothing in this pass: either they failed "
            "(see 'hook failed' in the server log) or a prefill CUDA graph replayed the layers without running "
            "hooks (pass --disable-prefill-cuda-graph / --disable-cuda-graph)"
        )


def check_layer_outputs(architectures: Any) -> None:
    """:class:`SetupError` unless the loaded decoder layers return ``(hidden, residual)`` (``layer_hooks``' premise)."""
    problem = layer_hooks_problem(architectures, compat.loaded_source, compat.tp_size())
    if problem:
        raise SetupError(
            f"hs_dataset capture cannot use mechanism '{Mechanism.LAYER_HOOKS}' on SGLang {compat.sglang_version()}: {problem}"
        )

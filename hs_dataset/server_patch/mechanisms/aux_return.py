"""``aux_return`` on the server: SGLang's model returns ``(post-norm hidden, aux)`` itself (SGLang 0.5.23+).

The server runs with ``--enable-return-aux-hidden-states --speculative-algorithm EAGLE3
--return-aux-hidden-state-layer-ids ...``, so SGLang gathers complete states at the layer
boundaries, whatever the parallel layout; the norm hook adds the pre-norm final state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hs_dataset.server_patch.contract.mechanism import Mechanism
from hs_dataset.server_patch.mechanisms.base import PassCapture, ServerMechanism

__all__ = ["AuxReturn"]

_NO_AUX = (
    "the model returned no aux hidden states: start the server with --enable-return-aux-hidden-states "
    "--speculative-algorithm EAGLE3 --return-aux-hidden-state-layer-ids ... (hs-dataset serve does)"
)


class AuxReturn(ServerMechanism):
    mechanism = Mechanism.AUX_RETURN

    def aux_states(self, output: Any, taken: PassCapture, hf_aux_layer_ids: Sequence[int]) -> tuple[Any, str | None]:
        """The model output's second element: one ``[T, K*H]`` tensor, or one tensor per layer (Llama on 0.5.23)."""
        if not (isinstance(output, (tuple, list)) and len(output) == 2):
            return None, _NO_AUX
        aux = output[1]
        if isinstance(aux, torch.Tensor):
            return aux, None
        if isinstance(aux, (tuple, list)) and aux and all(isinstance(a, torch.Tensor) for a in aux):  # AuxHiddenStateList
            return list(aux), None
        return None, _NO_AUX

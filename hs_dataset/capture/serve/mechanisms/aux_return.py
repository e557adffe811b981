"""``aux_return`` as launched: SGLang returns the aux states itself (``--enable-return-aux-hidden-states``, 0.5.23+)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from hs_dataset.capture.serve.facts import SGLangFacts
from hs_dataset.capture.serve.mechanisms.base import Launch, MechanismPlan
from hs_dataset.server_patch.contract.mechanism import Mechanism

__all__ = ["AuxReturnPlan"]


class AuxReturnPlan(MechanismPlan):
    mechanism = Mechanism.AUX_RETURN
    wants_sglang_ids: ClassVar[bool] = True

    def available(self, facts: SGLangFacts) -> bool:
        return facts.forward_hooks and facts.aux_return

    def server_args(self, launch: Launch, sglang_ids: Sequence[int] | None) -> list[str]:
        """SGLang's aux output for the ids it counts in; none for the final state only (no aux to return)."""
        if not sglang_ids:
            return []
        flag = "--" + str(self.mechanism.server_flag).replace("_", "-")
        return [flag, "--speculative-algorithm", "EAGLE3", "--return-aux-hidden-state-layer-ids", *map(str, sglang_ids)]

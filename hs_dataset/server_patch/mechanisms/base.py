"""What every server-side mechanism provides: its refusals of server arguments and the aux states of one pass.

Runs inside SGLang scheduler processes: stdlib, torch, the contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from hs_dataset.server_patch.contract.mechanism import CapturePath, Mechanism

__all__ = ["PassCapture", "ServerMechanism", "common_problems", "scattering_problems"]


@dataclass
class PassCapture:
    """What the norm and layer hooks parked during one forward pass, handed to the model hook."""

    final: torch.Tensor | None = None  # the pre-norm final state
    packed: torch.Tensor | None = None  # [N, K, H] the layer hooks wrote into
    layers: set[int] = field(default_factory=set)  # HF ids the layer hooks wrote in this pass
    layer_problem: str | None = None  # why a layer hook could not record (a layer output that is no tensor)


class ServerMechanism:
    """One mechanism as the server runs it; subclasses set the class attributes and override what differs."""

    mechanism: ClassVar[Mechanism]
    paths: ClassVar[frozenset[CapturePath]] = frozenset({CapturePath.PREFILL})
    takes_layer_hooks: ClassVar[bool] = False  # whether ``layer_hook`` specs belong to it

    def server_problems(self, args: Any) -> list[str]:
        """What in the server arguments (beyond :func:`common_problems`) makes its states partial or scattered."""
        return []

    def aux_states(self, output: Any, taken: PassCapture, hf_aux_layer_ids: Sequence[int]) -> tuple[Any, str | None]:
        """(the pass's aux states, ``None``) or (``None``, why there are none), from the model's output and the parked tensors."""
        raise NotImplementedError(f"mechanism {self.mechanism} captures without the model hook")


def _get(args: Any, name: str, default: Any = None) -> Any:
    return getattr(args, name, default)


def common_problems(args: Any) -> list[str]:
    """Server arguments that make captured states partial under every mechanism (empty list: fine; ``None``: unknown)."""
    if args is None:
        return []
    problems = []
    if int(_get(args, "pp_size", 1) or 1) != 1:
        problems.append("pipeline parallelism (pp_size > 1): only the last stage holds the final norm and late layers")
    if int(_get(args, "attn_cp_size", 1) or 1) != 1 or _get(args, "enable_prefill_cp", False):
        problems.append("context parallelism splits a prompt's tokens across ranks")
    if _get(args, "enable_flashinfer_allreduce_fusion", False):
        problems.append(
            "--enable-flashinfer-allreduce-fusion leaves layer outputs as un-reduced partial sums and fuses the final "
            "norm into the all-reduce"
        )
    return problems


def scattering_problems(args: Any) -> list[str]:
    """Server arguments that move tokens between ranks between layers: wrong for whatever reads layer outputs."""
    if args is None:
        return []
    problems = []
    a2a = _get(args, "moe_a2a_backend", None)
    if a2a not in (None, "none"):
        problems.append(f"--moe-a2a-backend {a2a} scatters tokens across ranks between layers")
    if _get(args, "enable_dp_attention", False) or int(_get(args, "attn_dp_size", 1) or 1) > 1:  # 0.5.23 resolves the flag
        problems.append("DP attention scatters tokens between layers (use SGLang 0.5.23's aux_return mechanism)")
    return problems

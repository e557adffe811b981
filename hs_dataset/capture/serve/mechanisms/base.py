"""What every mechanism's launch plan provides: when the installed SGLang allows it, what it refuses, what the server needs.

:class:`Launch` is what a mechanism reads from the card and the served model;
:class:`MechanismPlan` the defaults a mechanism overrides (:mod:`.aux_return`,
:mod:`.layer_hooks`, :mod:`.legacy`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from hs_dataset.capture.serve.facts import SGLangFacts
from hs_dataset.server_patch.contract.mechanism import CapturePath, Mechanism

__all__ = ["Launch", "MechanismPlan"]


@dataclass(frozen=True)
class Launch:
    """The server a mechanism plans for: the card's choices and the model it serves."""

    source_path: str  # the card, named in refusals
    version: str  # the installed SGLang
    device: str  # ``cuda`` or ``cpu``
    architectures: tuple[str, ...]
    module_path: str  # the decoder stack the hooks go on
    num_layers: int
    hf_ids: tuple[int, ...]  # the aux layers (none: the final state only)
    tp: int  # the card's sglang.tp
    args: tuple[str, ...]  # the card's sglang.args and the extra arguments
    radix_cache: bool
    chunked_prefill_size: int | None
    sglang_dir: str | None  # the installed SGLang's package directory (its source is read, never imported)


class MechanismPlan:
    """One mechanism as ``hs-dataset serve`` launches it; subclasses set the class attributes and override what differs."""

    mechanism: ClassVar[Mechanism]
    paths: ClassVar[frozenset[CapturePath]] = frozenset({CapturePath.PREFILL})
    wants_sglang_ids: ClassVar[bool] = False  # whether SGLang is told the aux layers (--return-aux-hidden-state-layer-ids)
    final_state_source: ClassVar[str] = "(hook on the final norm)"  # where the pre-norm final state comes from (--check)

    def available(self, facts: SGLangFacts) -> bool:
        """Whether the installed SGLang's source provides what it needs."""
        raise NotImplementedError

    def refuse(self, launch: Launch) -> None:
        """A :class:`~hs_dataset.capture.serve.errors.ServeError` naming the fix where it cannot capture this launch."""

    def notes(self, launch: Launch, facts: SGLangFacts, requested: str) -> list[str]:
        """What ``--check`` and the launch log should say about choosing it (``requested``: the card's value)."""
        return []

    def server_args(self, launch: Launch, sglang_ids: Sequence[int] | None) -> list[str]:
        """SGLang arguments it needs."""
        return []

    def server_env(self, hook_config: Mapping[str, Any], launch: Launch, notes: list[str]) -> dict[str, str]:
        """Environment variables it needs (and the notes saying why)."""
        return {}

    def layer_specs(self, launch: Launch, hook_config: Mapping[str, Any], hooks_module: str) -> list[dict[str, Any]]:
        """``--forward-hooks`` specs it adds between the final-norm hook and the model hook."""
        return []

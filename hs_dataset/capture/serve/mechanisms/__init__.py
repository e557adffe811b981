"""The launch side of each capture mechanism, one object per :class:`~hs_dataset.server_patch.contract.mechanism.Mechanism`.

:func:`choose` picks the card's mechanism where the installed SGLang allows it (``auto``:
the first in the enum's order that it allows); :data:`PLANS` holds one
:class:`~.base.MechanismPlan` per mechanism, one found in each module of this package
(:func:`~hs_dataset.server_patch.contract.mechanism.one_per_mechanism`). Adding a mechanism:
its member in the contract enum and its module here.
"""

from __future__ import annotations

from hs_dataset.capture.serve.facts import SGLangFacts
from hs_dataset.capture.serve.mechanisms.base import Launch, MechanismPlan
from hs_dataset.capture.sglang.support import UnsupportedVersionError
from hs_dataset.server_patch.contract.mechanism import AUTO, Mechanism, one_per_mechanism

__all__ = ["PLANS", "Launch", "MechanismPlan", "available", "choose", "plan_for"]

PLANS: dict[Mechanism, MechanismPlan] = one_per_mechanism(__name__, __path__, MechanismPlan)


def plan_for(mechanism: Mechanism | str) -> MechanismPlan:
    """The launch side of ``mechanism``."""
    return PLANS[Mechanism.parse(mechanism, "capture plan")]


def available(facts: SGLangFacts) -> list[Mechanism]:
    """The mechanisms the installed SGLang allows, in order of preference."""
    return [m for m in Mechanism if PLANS[m].available(facts)]


def choose(facts: SGLangFacts, requested: str = AUTO) -> MechanismPlan:
    """The card's mechanism where the installed source allows it, else the best it allows (:class:`UnsupportedVersionError` if none)."""
    allowed = available(facts)
    if not allowed:
        raise UnsupportedVersionError(
            f"SGLang {facts.version} has no forward hooks (its server arguments define no forward_hooks) and its "
            "models/deepseek_v2.py carries no hs_dataset patch: patch it with `hs-dataset patch apply --python "
            "<server python>` (docs/LEGACY_PATCH.md), then serve again"
        )
    if requested == AUTO:
        return PLANS[allowed[0]]
    if requested not in allowed:
        raise UnsupportedVersionError(f"mechanism {requested!r} is not available on SGLang {facts.version} (use {allowed[0].value!r})")
    return PLANS[Mechanism(requested)]

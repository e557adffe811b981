"""How captured states leave an SGLang server: the one list of capture mechanisms and capture paths.

Every other spelling of a mechanism -- the card schema (``sglang.mechanism``), the hook
config (:class:`~hs_dataset.server_patch.config.CaptureConfig`), the support table, the
plan's and the server's behaviour per mechanism -- is derived from :class:`Mechanism`, so
adding one starts here. The members are listed in order of preference: ``auto`` picks the
first one the installed SGLang provides. Stdlib only: client and server both read it.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar, Protocol, TypeVar

__all__ = ["AUTO", "CARD_CHOICES", "DEFAULT_MECHANISM", "CapturePath", "Mechanism", "one_per_mechanism"]


class _OneMechanism(Protocol):
    """What :func:`one_per_mechanism` reads of each object: the mechanism it stands for."""

    mechanism: ClassVar[Mechanism]


_T = TypeVar("_T", bound=_OneMechanism)


class _Named(str, Enum):
    """A string-valued enum whose ``str()`` and f-string form is its value (JSON, logs and messages carry the value)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class CapturePath(_Named):
    """Which forward passes a mechanism captures states from."""

    PREFILL = "prefill"  # the prompt's prefill (extend) passes


class Mechanism(_Named):
    """How the aux states reach the capture hooks (in order of preference)."""

    AUX_RETURN = "aux_return"  # SGLang returns them itself (--enable-return-aux-hidden-states), hooks on norm and model
    LAYER_HOOKS = "layer_hooks"  # forward hooks on the decoder layers record hidden + residual
    LEGACY = "legacy"  # the source patch of an SGLang without forward hooks (hs-dataset patch apply)

    @property
    def uses_forward_hooks(self) -> bool:
        """Whether its server runs hs_dataset's ``--forward-hooks`` (the source patch reports through its status file only)."""
        return _TRAITS[self].uses_forward_hooks

    @property
    def summary(self) -> str:
        """What it is, in a few words (the card documentation lists it)."""
        return _TRAITS[self].summary

    @property
    def server_flag(self) -> str | None:
        """The SGLang server argument (as ``/server_info`` names it) it needs on wherever aux layers are captured."""
        return _TRAITS[self].server_flag

    @classmethod
    def parse(cls, value: object, where: str) -> Mechanism:
        """``value`` as a mechanism; a :class:`ValueError` naming ``where`` and the accepted values otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"{where}: mechanism must be one of {[m.value for m in cls]}, got {value!r}") from None


@dataclass(frozen=True)
class _Traits:
    """What both sides read of a mechanism without its objects (the client's checks of a running server)."""

    summary: str
    uses_forward_hooks: bool = True
    server_flag: str | None = None


_TRAITS: dict[Mechanism, _Traits] = {  # one row per member (a unit test holds them together)
    Mechanism.AUX_RETURN: _Traits(
        "SGLang returns the aux states itself: `--enable-return-aux-hidden-states`, 0.5.23+", server_flag="enable_return_aux_hidden_states"
    ),
    Mechanism.LAYER_HOOKS: _Traits("forward hooks on the decoder layers, SGLang 0.5.9 - 0.5.19"),
    Mechanism.LEGACY: _Traits("the source patch of an SGLang without forward hooks, `hs-dataset patch apply`", uses_forward_hooks=False),
}

AUTO = "auto"  # a card's request for the first mechanism the installed SGLang provides
CARD_CHOICES: tuple[str, ...] = (AUTO, *(m.value for m in Mechanism))  # what a card's sglang.mechanism accepts
DEFAULT_MECHANISM = Mechanism.AUX_RETURN  # what a hook config without the key means (servers started before the key)


def one_per_mechanism(package: str, package_path: Iterable[str], base: type[_T]) -> dict[Mechanism, _T]:
    """One instance of each ``base`` subclass the modules of ``package`` define, keyed by its ``mechanism``, in the enum's order.

    Why discovered: adding a mechanism is then its member above and one module on each side,
    with no registry to edit; a member without its object (or with two) fails at import,
    naming the package and the member.
    """
    for info in pkgutil.iter_modules(list(package_path)):
        importlib.import_module(f"{package}.{info.name}")
    found: dict[Mechanism, _T] = {}
    for cls in base.__subclasses__():
        obj = cls()
        mechanism = Mechanism(obj.mechanism)
        if mechanism in found:
            raise TypeError(f"{package}: two objects for mechanism {mechanism}: {type(found[mechanism]).__name__} and {cls.__name__}")
        found[mechanism] = obj
    missing = [m.value for m in Mechanism if m not in found]
    if missing:
        raise TypeError(f"{package}: no {base.__name__} for mechanism(s) {missing}: add a module defining one")
    return {m: found[m] for m in Mechanism}

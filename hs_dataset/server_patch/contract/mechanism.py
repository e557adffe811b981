"""How captured states leave an SGLang server: the one list of capture mechanisms and capture paths.

Every other spelling of a mechanism -- the card schema (``sglang.mechanism``), the hook
config (:class:`~hs_dataset.server_patch.config.CaptureConfig`), the support table, the
plan's and the server's behaviour per mechanism -- is derived from :class:`Mechanism`, so
adding one starts here. The members are listed in order of preference: ``auto`` picks the
first one the installed SGLang provides. Stdlib only: client and server both read it.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["AUTO", "CARD_CHOICES", "DEFAULT_MECHANISM", "CapturePath", "Mechanism"]


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
        return self is not Mechanism.LEGACY

    @property
    def server_flag(self) -> str | None:
        """The SGLang server argument (as ``/server_info`` names it) it needs on wherever aux layers are captured."""
        return "enable_return_aux_hidden_states" if self is Mechanism.AUX_RETURN else None

    @classmethod
    def parse(cls, value: object, where: str) -> "Mechanism":
        """``value`` as a mechanism; a :class:`ValueError` naming ``where`` and the accepted values otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"{where}: mechanism must be one of {[m.value for m in cls]}, got {value!r}") from None


AUTO = "auto"  # a card's request for the first mechanism the installed SGLang provides
CARD_CHOICES: tuple[str, ...] = (AUTO, *(m.value for m in Mechanism))  # what a card's sglang.mechanism accepts
DEFAULT_MECHANISM = Mechanism.AUX_RETURN  # what a hook config without the key means (servers started before the key)

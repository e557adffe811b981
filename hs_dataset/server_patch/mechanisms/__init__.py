"""The server side of each capture mechanism, one object per :class:`~hs_dataset.server_patch.contract.mechanism.Mechanism`.

:func:`server_mechanism` gives the object, one found in each module of this package
(:func:`~hs_dataset.server_patch.contract.mechanism.one_per_mechanism`); :func:`check_server_args`
the refusals of a server set-up for one mechanism. Adding a mechanism: its member in the
contract enum and its module here.
"""

from __future__ import annotations

from typing import Any

from hs_dataset.server_patch.contract.mechanism import Mechanism, one_per_mechanism
from hs_dataset.server_patch.mechanisms.base import ServerMechanism, common_problems

__all__ = ["SERVER_MECHANISMS", "check_server_args", "server_mechanism"]

SERVER_MECHANISMS: dict[Mechanism, ServerMechanism] = one_per_mechanism(__name__, __path__, ServerMechanism)


def server_mechanism(mechanism: Mechanism | str) -> ServerMechanism:
    """The server-side object of ``mechanism`` (a :class:`ValueError` naming the accepted values for an unknown one)."""
    return SERVER_MECHANISMS[Mechanism.parse(mechanism, "capture config")]


def check_server_args(args: Any, mechanism: Mechanism | str) -> list[str]:
    """Problems that make captured states partial or token-scattered under ``mechanism`` (empty list: fine)."""
    return common_problems(args) + server_mechanism(mechanism).server_problems(args)

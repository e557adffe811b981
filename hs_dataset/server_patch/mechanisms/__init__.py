"""The server side of each capture mechanism, one object per :class:`~hs_dataset.server_patch.contract.mechanism.Mechanism`.

:func:`server_mechanism` gives the object; :func:`check_server_args` the refusals of a
server set-up for one mechanism. Adding a mechanism: its module here and one entry in
:data:`SERVER_MECHANISMS`.
"""

from __future__ import annotations

from typing import Any

from hs_dataset.server_patch.contract.mechanism import Mechanism
from hs_dataset.server_patch.mechanisms.aux_return import AuxReturn
from hs_dataset.server_patch.mechanisms.base import ServerMechanism, common_problems
from hs_dataset.server_patch.mechanisms.layer_hooks import LayerHooks
from hs_dataset.server_patch.mechanisms.legacy import Legacy

__all__ = ["SERVER_MECHANISMS", "check_server_args", "server_mechanism"]

SERVER_MECHANISMS: dict[Mechanism, ServerMechanism] = {m.mechanism: m for m in (AuxReturn(), LayerHooks(), Legacy())}


def server_mechanism(mechanism: Mechanism | str) -> ServerMechanism:
    """The server-side object of ``mechanism`` (a :class:`ValueError` naming the accepted values for an unknown one)."""
    return SERVER_MECHANISMS[Mechanism.parse(mechanism, "capture config")]


def check_server_args(args: Any, mechanism: Mechanism | str) -> list[str]:
    """Problems that make captured states partial or token-scattered under ``mechanism`` (empty list: fine)."""
    return common_problems(args) + server_mechanism(mechanism).server_problems(args)

"""The trainers hs_dataset writes for and reads from: one registry, as ``cli/main.py:COMMANDS`` is for commands.

Each entry names a package under :mod:`hs_dataset.interop` that holds ``settings.py``
(its :class:`~hs_dataset.interop.settings.ExportSettings` subclass, named here too),
``export.py`` (``export_<name>(src, dest, settings)``, the trainer's hooks of the one
export loop in :mod:`hs_dataset.interop.exporting`), ``import_.py`` (``import_<name>(src,
dest, ImportSettings, ...)``) and ``cli.py`` (the help lines and the options only that
trainer has, for ``hs-dataset export`` and ``import``; and, for a trainer that
``hs-dataset train`` launches, ``TRAIN_HELP``, ``add_train_arguments`` and ``train``).
Adding a trainer is its package plus one entry here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from hs_dataset.errors import UsageError
from hs_dataset.interop.settings import ExportSettings
from hs_dataset.interop.specforge.settings import SpecForgeExportSettings
from hs_dataset.interop.speculators.settings import SpeculatorsExportSettings

__all__ = ["TRAINERS", "Trainer", "launcher_cli", "train_launchers", "trainer_cli"]


@dataclass(frozen=True)
class Trainer:
    """One trainer: its package, the settings its export takes, and whether ``hs-dataset train`` launches it."""

    package: str
    export_settings: type[ExportSettings]
    launches_training: bool = False


# trainer name -> what hs_dataset has for it
TRAINERS: dict[str, Trainer] = {
    "speculators": Trainer("hs_dataset.interop.speculators", SpeculatorsExportSettings, launches_training=True),
    "specforge": Trainer("hs_dataset.interop.specforge", SpecForgeExportSettings),
}


def trainer_cli(name: str) -> ModuleType:
    """The trainer's ``cli`` module: light to import (the parser is built from it), heavy work inside its functions."""
    return importlib.import_module(f"{TRAINERS[name].package}.cli")


def train_launchers() -> list[str]:
    """The trainers ``hs-dataset train`` can run, in registry order."""
    return [name for name, trainer in TRAINERS.items() if trainer.launches_training]


def launcher_cli(name: str) -> ModuleType:
    """The ``cli`` module of a trainer ``hs-dataset train`` runs; any other name is refused in one line naming those."""
    trainer = TRAINERS.get(name)
    if trainer is None or not trainer.launches_training:
        if trainer is None:
            raise UsageError(f"unknown trainer {name!r}; hs-dataset train runs {', '.join(train_launchers())}")
        raise UsageError(
            f"{name} has no train launcher; hs-dataset train runs {', '.join(train_launchers())} "
            f"(for {name}: hs-dataset export {name} DIR DEST, then its own trainer)"
        )
    return trainer_cli(name)

"""The trainers hs_dataset writes for and reads from: one registry, as ``cli/main.py:COMMANDS`` is for commands.

Each entry names a package under :mod:`hs_dataset.interop` that holds ``export.py``
(``export_<name>(src, dest, ExportSettings)``), ``import_.py`` (``import_<name>(src,
dest, ImportSettings, ...)``) and ``cli.py`` (the help lines and the options only that
trainer has, for ``hs-dataset export`` and ``import``). Adding a trainer is its package
plus one line here.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["TRAINERS", "trainer_cli"]

# trainer name -> its package
TRAINERS: dict[str, str] = {
    "speculators": "hs_dataset.interop.speculators",
    "specforge": "hs_dataset.interop.specforge",
}


def trainer_cli(name: str) -> ModuleType:
    """The trainer's ``cli`` module: light to import (the parser is built from it), heavy work inside its functions."""
    return importlib.import_module(f"{TRAINERS[name]}.cli")

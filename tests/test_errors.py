"""Every exception class hs_dataset raises on purpose is an HsDatasetError, so one ``except`` catches them all."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import hs_dataset
from hs_dataset.errors import HsDatasetError

SKIPPED = ("hs_dataset.demo", "hs_dataset.server_patch.cpu_support")


def _module_names() -> list[str]:
    names = [info.name for info in pkgutil.walk_packages(hs_dataset.__path__, "hs_dataset.")]
    return sorted(n for n in names if not n.startswith(SKIPPED))


def _public_exceptions(module) -> list[type]:
    return [
        obj
        for name, obj in vars(module).items()
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__ and not name.startswith("_")
    ]


def test_the_walk_finds_the_modules_that_define_errors():
    names = _module_names()
    for expected in (
        "hs_dataset.config",
        "hs_dataset.config.problems",
        "hs_dataset.server_patch.legacy.edit",
        "hs_dataset.interop.common",
        "hs_dataset.interop.importing",
        "hs_dataset.cli.main",
    ):
        assert expected in names


@pytest.mark.parametrize("module_name", _module_names())
def test_public_exceptions_derive_from_hs_dataset_error(module_name):
    module = importlib.import_module(module_name)
    strays = [cls.__qualname__ for cls in _public_exceptions(module) if not issubclass(cls, HsDatasetError)]
    assert strays == [], f"{module_name}: {strays} must subclass hs_dataset.errors.HsDatasetError"


def test_old_bases_are_kept_for_existing_except_clauses():
    from hs_dataset.capture.serve.layer_ids import LayerIdError
    from hs_dataset.capture.sglang.support import UnsupportedVersionError
    from hs_dataset.config import CardError
    from hs_dataset.server_patch.contract.private_dir import StagingError

    assert issubclass(CardError, ValueError) and issubclass(LayerIdError, ValueError)
    assert issubclass(UnsupportedVersionError, ValueError) and issubclass(StagingError, RuntimeError)

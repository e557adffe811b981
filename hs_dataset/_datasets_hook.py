"""Make ``datasets.load_dataset("hs_dataset", ...)`` resolve to our builder after ``import hs_dataset``.

datasets >= 4 no longer runs loading scripts, and an installed package is not
looked up by name. We wrap ``datasets.load.dataset_module_factory`` so the name
``hs_dataset`` maps to :mod:`hs_dataset.builder`; every other name goes through
untouched. If ``datasets`` is not imported yet, a tiny import hook applies the
wrap when it is, so ``import hs_dataset`` never pays for importing ``datasets``.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any

__all__ = ["install", "DATASET_NAME"]

DATASET_NAME = "hs_dataset"
_MARK = "_hs_dataset_wrapped"


def _wrap(load_module: Any) -> None:
    original = load_module.dataset_module_factory
    if getattr(original, _MARK, False):
        return

    def dataset_module_factory(path: str, *args: Any, **kwargs: Any) -> Any:
        if path == DATASET_NAME:
            from hs_dataset.builder import builder_module

            return builder_module()
        return original(path, *args, **kwargs)

    setattr(dataset_module_factory, _MARK, True)
    dataset_module_factory.__doc__ = original.__doc__
    load_module.dataset_module_factory = dataset_module_factory


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Wraps ``datasets.load`` right after it is first executed."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "datasets.load":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_wrap(module: Any) -> None:
            exec_module(module)
            _wrap(module)

        loader.exec_module = exec_and_wrap  # type: ignore[method-assign]
        return spec


def install() -> None:
    if "datasets.load" in sys.modules:
        _wrap(sys.modules["datasets.load"])
        return
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())

"""TEST-ONLY: the import machinery the test shims for SGLang's CPU path share.

A shim is a ``sitecustomize.py`` put first on one test server's ``PYTHONPATH``. It
patches a module of SGLang right after SGLang imports it (nothing in site-packages
is edited), then runs the ``sitecustomize`` it shadows (hs_dataset's CPU support
one), since Python imports only the first on the path.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable

__all__ = ["patch_on_import", "run_next_sitecustomize"]


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real module, then the shim's patch on it."""

    def __init__(self, inner: importlib.abc.Loader, patch: Callable) -> None:
        self.inner = inner
        self.patch = patch

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        self.patch(module)


class _PatchingFinder(importlib.abc.MetaPathFinder):
    def __init__(self, targets: frozenset[str], patch: Callable) -> None:
        self.targets = targets
        self.patch = patch

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.targets:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader, self.patch)
        return spec


def patch_on_import(targets: Iterable[str], patch: Callable) -> None:
    """Call ``patch(module)`` right after each of ``targets`` is imported (once per process)."""
    targets = frozenset(targets)
    if not any(isinstance(f, _PatchingFinder) and f.targets == targets for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchingFinder(targets, patch))


def run_next_sitecustomize(here: str) -> None:
    """Run the first ``sitecustomize.py`` on ``sys.path`` outside ``here`` (the one the shim shadows)."""
    for entry in sys.path:
        candidate = os.path.join(entry or os.getcwd(), "sitecustomize.py")
        if os.path.abspath(entry or os.getcwd()) != here and os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_hs_shadowed_sitecustomize", candidate)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            return

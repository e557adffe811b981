"""CPU servers: let PyPI's torchvision import next to a CPU-only torch.

``torchvision/_meta_registrations.py`` registers a fake kernel for
``torchvision::nms`` unconditionally; with a CPU torch the compiled torchvision
ops are not loaded and that registration raises at import time, which breaks
``import transformers`` (and so SGLang). This module, imported by Python at
start-up because its folder is on ``sys.path``, installs a meta-path finder that
loads that one module as an empty module *only* when
``torchvision.extension._has_ops()`` is False. Everything else is untouched.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

_TARGET = "torchvision._meta_registrations"


class _EmptyModuleLoader(importlib.abc.Loader):
    def create_module(self, spec):  # default module creation
        return None

    def exec_module(self, module) -> None:
        module.__doc__ = "Skipped by hs_dataset cpu_support/sitecustomize.py: torchvision ops are not available."


class _SkipTorchvisionMeta(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != _TARGET:
            return None
        try:
            from torchvision import extension

            if extension._has_ops():
                return None  # the real ops exist: import the real module
        except Exception:  # pragma: no cover - let the normal import report the problem
            return None
        return importlib.machinery.ModuleSpec(fullname, _EmptyModuleLoader())


if not any(isinstance(f, _SkipTorchvisionMeta) for f in sys.meta_path):
    sys.meta_path.insert(0, _SkipTorchvisionMeta())

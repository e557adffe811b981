"""TEST-ONLY: the ``sgl_kernel`` names SGLang 0.5.5 imports on its CPU path, for a CPU without AMX.

SGLang 0.5.5 imports dozens of GPU kernels from ``sgl_kernel`` (and its submodules
``flash_attn``, ``scalar_type``, ``kvcacheio`` ...) at module import time, whatever the
device; the CPU build of sgl-kernel that would answer them is not on PyPI. On a CPU
without AMX (``cpu_has_amx_support()`` false) none of them is called on the path the
legacy test server runs (float32, ``torch_native`` attention, no quantization, no
speculative decoding): SGLang's own torch-native branches are taken. So every name
here is a placeholder that raises, naming itself, if it is ever called, except
:func:`assign_req_to_token_pool_cpu` (hs_dataset's CPU stand-in, re-exported).

``tests/server_patch/legacy/test_patched_server.py`` puts this folder first on the
0.5.5 server's ``PYTHONPATH``. Nothing in site-packages is edited.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path

_STAND_IN = Path(__file__).resolve().parents[4] / "hs_dataset" / "server_patch" / "cpu_support" / "sgl_kernel" / "__init__.py"
_spec = importlib.util.spec_from_file_location("_hs_sgl_kernel_stand_in", _STAND_IN)
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
assign_req_to_token_pool_cpu = _base.assign_req_to_token_pool_cpu
__version__ = _base.__version__
HS_DATASET_STAND_IN = True
HS_DATASET_LEGACY_TEST_SHIM = True


class _Missing:
    """An imported-but-never-called kernel: attribute access yields more placeholders, a call raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Missing:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(
            f"{self._name} is a placeholder of the SGLang 0.5.5 CPU test shim (tests/shims/sglang_legacy_shim): "
            "this code path needs the real sgl-kernel"
        )

    def __repr__(self) -> str:
        return f"<sgl_kernel placeholder {self._name}>"


def __getattr__(name: str) -> _Missing:
    if name.startswith("__"):
        raise AttributeError(name)
    return _Missing(f"sgl_kernel.{name}")


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``sgl_kernel.<anything>``: a module whose every name is a placeholder."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = lambda name, _m=spec.name: _missing_attr(_m, name)
        return module

    def exec_module(self, module) -> None:
        return None


def _missing_attr(module: str, name: str) -> _Missing:
    if name.startswith("__"):
        raise AttributeError(name)
    return _Missing(f"{module}.{name}")


if not any(isinstance(f, _SubmoduleFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _SubmoduleFinder())

"""TEST-ONLY shim for SGLang 0.5.23's CPU path under DP attention; never shipped, never installed.

With ``--enable-dp-attention`` the DP groups' batches are padded to a common size, and
the padding asks the attention backend for ``get_cpu_graph_seq_len_fill_value()``
(``model_executor/forward_batch_info.py``). Only the AMX backend defines it (returning 1),
so on a CPU without AMX (``torch_native``) the first prefill crashes. This module gives
``TorchNativeAttnBackend`` the same method, returning the same 1, when SGLang imports it.

``tests/test_sglang_parallel.py`` puts this folder first on the DP server's
``PYTHONPATH``; Python then imports this file as ``sitecustomize`` in every server
process. It runs the next ``sitecustomize.py`` on ``sys.path`` (the CPU support one,
``hs_dataset/server_patch/cpu_support``) so nothing it does is lost. Nothing in
site-packages is edited.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_TARGET = "sglang.srt.layers.attention.torch_native_backend"
_HERE = os.path.dirname(os.path.abspath(__file__))


def _seq_len_fill_value(self) -> int:
    """What SGLang's AMX backend returns: padded rows get sequence length 1."""
    return 1


class _AddFillValue(importlib.abc.Loader):
    """Runs the real module, then adds the missing method (if SGLang still lacks it)."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        cls = getattr(module, "TorchNativeAttnBackend", None)
        if cls is not None and not hasattr(cls, "get_cpu_graph_seq_len_fill_value"):
            cls.get_cpu_graph_seq_len_fill_value = _seq_len_fill_value


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _AddFillValue(spec.loader)
        return spec


def _run_next_sitecustomize() -> None:
    """Python imports only the first ``sitecustomize``: run the one this file shadows."""
    for entry in sys.path:
        candidate = os.path.join(entry or os.getcwd(), "sitecustomize.py")
        if os.path.abspath(entry or os.getcwd()) != _HERE and os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_hs_shadowed_sitecustomize", candidate)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            return


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
_run_next_sitecustomize()

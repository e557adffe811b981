"""TEST-ONLY shim for SGLang 0.5.23's CPU path under DP attention; never shipped, never installed.

With ``--enable-dp-attention`` the DP groups' batches are padded to a common size, and
the padding asks the attention backend for ``get_cpu_graph_seq_len_fill_value()``
(``model_executor/forward_batch_info.py``). Only the AMX backend defines it (returning 1),
so on a CPU without AMX (``torch_native``) the first prefill crashes. This module gives
``TorchNativeAttnBackend`` the same method, returning the same 1, when SGLang imports it.

``tests/capture/sglang/test_parallel_server.py`` puts this folder first on the DP server's
``PYTHONPATH``; Python then imports this file as ``sitecustomize`` in every server
process. It runs the next ``sitecustomize.py`` on ``sys.path`` (the CPU support one,
``hs_dataset/server_patch/cpu_support``) so nothing it does is lost. Nothing in
site-packages is edited.
"""

from __future__ import annotations

import os
import sys

_TARGET = "sglang.srt.layers.attention.torch_native_backend"
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(_HERE), "sglang_shim_lib"))

from hs_test_shim_hooks import patch_on_import, run_next_sitecustomize  # noqa: E402


def _seq_len_fill_value(self) -> int:
    """What SGLang's AMX backend returns: padded rows get sequence length 1."""
    return 1


def _add_fill_value(module) -> None:
    """Add the missing method to the real backend class (if SGLang still lacks it)."""
    cls = getattr(module, "TorchNativeAttnBackend", None)
    if cls is not None and not hasattr(cls, "get_cpu_graph_seq_len_fill_value"):
        cls.get_cpu_graph_seq_len_fill_value = _seq_len_fill_value


patch_on_import([_TARGET], _add_fill_value)
run_next_sitecustomize(_HERE)

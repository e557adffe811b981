"""TEST-ONLY shim for SGLang 0.5.5's CPU path (the legacy source patch's test server); never shipped.

SGLang 0.5.5 picks DeepseekV2/V3's attention path from ``AttentionBackendRegistry`` in
``sglang/srt/models/deepseek_v2.py``, keyed by the attention backend name; ``torch_native``
has no entry there, so the registry falls back to the ``triton`` handler, whose prefill
takes the MHA path, which ``torch_native`` cannot run for MLA. 0.5.5 has no forward hooks
(the home of hs_dataset's CPU MLA factory on later releases), so this module registers the
same handler (the MLA sub-type choice) when SGLang imports that module. It then runs the
next ``sitecustomize`` on the path (hs_dataset's CPU support one). Nothing in
site-packages is edited.
"""

from __future__ import annotations

import os
import sys

_TARGET = "sglang.srt.models.deepseek_v2"
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(_HERE), "sglang_shim_lib"))

from hs_test_shim_hooks import patch_on_import, run_next_sitecustomize  # noqa: E402


def _register_mla(module) -> None:
    registry = module.AttentionBackendRegistry
    if "torch_native" not in registry._handlers:
        registry.register("torch_native", lambda attn, forward_batch: module._dispatch_mla_subtype(attn, forward_batch))


patch_on_import([_TARGET], _register_mla)
run_next_sitecustomize(_HERE)

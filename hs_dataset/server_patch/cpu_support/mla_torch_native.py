"""CPU servers: register SGLang's ``torch_native`` attention backend for MLA models.

SGLang 0.5.23 picks the DeepseekV2/V3 attention path from
``AttentionBackendRegistry`` keyed by the attention backend name; ``torch_native``
has no entry, so the prefill goes down the MHA path and fails with a shape error
(on CPU that is the only usable backend). :func:`factory` is used as a
``--forward-hooks`` hook factory purely for its side effect: it runs inside every
scheduler process before the warm-up, registers a handler that dispatches to the
MLA sub-type choice, and returns ``None`` (no hook is attached).

Usage (``hs-dataset serve`` adds this for cards with ``device: cpu``)::

    --forward-hooks '[{"name": "hs_cpu_mla", "target_modules": ["model"],
                       "hook_factory": "hs_dataset.server_patch.cpu_support.mla_torch_native:factory",
                       "config": {}}]'
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

_REGISTERED = False


def _torch_native_handler(attn, forward_batch):
    from sglang.srt.models.deepseek_common import attention_backend_handler as abh

    return abh._dispatch_mla_subtype(attn, forward_batch)


def register() -> bool:
    """Register the handler once; return False when this SGLang has no such registry."""
    global _REGISTERED
    if _REGISTERED:
        return True
    try:
        from sglang.srt.models.deepseek_common import attention_backend_handler as abh
    except ImportError:
        logger.info("hs_cpu_mla: no deepseek_common.attention_backend_handler in this SGLang; nothing to register")
        return False
    registry = abh.AttentionBackendRegistry
    if "torch_native" not in getattr(registry, "_handlers", {}):
        registry.register("torch_native", _torch_native_handler)
    _REGISTERED = True
    logger.info("hs_cpu_mla: registered torch_native MLA attention handler (CPU server support)")
    return True


def factory(config=None):
    register()
    return None

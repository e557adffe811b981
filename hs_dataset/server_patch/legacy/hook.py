"""Adapter between the SGLang <= 0.5.5 source patch (:mod:`hs_dataset.server_patch.legacy.patch`) and the capture core.

The patched ``DeepseekV2Model.forward`` calls :func:`wants` at the start of a pass
and :func:`on_forward` after the layer loop, with the aux states it captured
(``hidden_states + residual`` entering each layer in ``layer_ids`` = HF
``hidden_states`` indexes) and the pre-norm final state. Configuration comes from
``HS_CAPTURE_*`` environment variables (``HS_CAPTURE_STAGING_DIR``,
``HS_CAPTURE_LAYER_IDS``, ... see :class:`~hs_dataset.server_patch.config.CaptureConfig`).

SGLang 0.5.5's ForwardBatch has no request ids, so dumps are named by content key
(``ck-`` + sha256 of the prompt's int64 ids; the client computes the same). Nothing then
ties a prefill's rows to a prompt longer than them, so a server whose arguments allow
partial prompts -- chunked prefill (the chunks of one prompt cannot be joined) or the
radix cache (a cache hit computes only the tail) -- is refused at its first forward pass
with the flag to change (:func:`~hs_dataset.server_patch.mechanisms.legacy.legacy_problems`), instead of storing a first chunk under
the wrong key while the client waits for the whole prompt. Stdlib + torch only.
"""

from __future__ import annotations

import logging
import threading

from hs_dataset.server_patch import compat
from hs_dataset.server_patch.batch import BatchView
from hs_dataset.server_patch.config import CaptureConfig
from hs_dataset.server_patch.contract.mechanism import Mechanism
from hs_dataset.server_patch.core import CaptureCore
from hs_dataset.server_patch.mechanisms import check_server_args

__all__ = ["on_forward", "wants"]

logger = logging.getLogger("hs_dataset.server_patch")

_LOCK = threading.Lock()
_STATE: dict = {}


def _core() -> CaptureCore | None:
    with _LOCK:
        if "core" not in _STATE:
            config = CaptureConfig.from_sources({"mechanism": Mechanism.LEGACY.value})
            problems = check_server_args(compat.server_args(), Mechanism.LEGACY)
            if problems:
                raise RuntimeError("hs_dataset capture cannot produce complete hidden states here: " + "; ".join(problems))
            tp, dp, _ = compat.attention_ranks()
            _STATE["core"] = (
                CaptureCore(config, sglang_version=compat.sglang_version(), extra_metadata={"attn_dp_rank": str(dp)}) if tp == 0 else None
            )
            logger.info("hs_dataset legacy capture: rank tp=%d dp=%d %s", tp, dp, "writes" if tp == 0 else "does not write")
        return _STATE["core"]


def wants(forward_batch) -> bool:
    """True when this pass should be captured: exactly EXTEND, on the writing rank."""
    if getattr(getattr(forward_batch, "forward_mode", None), "name", None) != "EXTEND":
        return False
    return _core() is not None


def on_forward(forward_batch, aux_states, prenorm_final, layer_ids) -> None:
    core = _core()
    if core is None:
        return
    if list(layer_ids) != list(core.config.hf_aux_layer_ids):
        raise RuntimeError(
            f"hs_dataset: the patch captured layers {list(layer_ids)} but HS_CAPTURE_LAYER_IDS says {list(core.config.hf_aux_layer_ids)}"
        )
    batch = BatchView.from_forward_batch(forward_batch)
    core.process(batch, aux=list(aux_states), final_prenorm=prenorm_final)

"""What the patch inserts into ``deepseek_v2.py``: one helper block and three statements, every line marked.

The helper block goes before ``class DeepseekV2Model`` between a header line that
records the original's sha256 and an end line; each statement goes into
``DeepseekV2Model.forward`` at its anchor (:mod:`hs_dataset.server_patch.legacy.anchors`)
with :data:`MARKER` at the end of its line, so the edit can be found and removed
again (:mod:`hs_dataset.server_patch.legacy.edit`).
"""

from __future__ import annotations

import re

from hs_dataset.server_patch.contract.legacy_header import PATCH_VERSION

__all__ = ["ANY_MARK", "BEGIN_RE", "END", "HELPER", "MARKER", "STMT_BEGIN", "STMT_CAPTURE", "STMT_EMIT"]

MARKER = f"# hs_dataset-patch v{PATCH_VERSION}"
END = f"# <<< hs_dataset-patch v{PATCH_VERSION}"
ANY_MARK = "hs_dataset-patch"
BEGIN_RE = re.compile(r"^# >>> hs_dataset-patch v(\d+) original-sha256=([0-9a-f]{64})\b")

# Module-level helper inserted before `class DeepseekV2Model`.  It is server code:
# standard library only, imports the capture hook lazily, and does nothing (imports
# nothing) unless HS_CAPTURE_STAGING_DIR is set.
HELPER = '''\
_HS_DATASET_STATE = None


def _hs_dataset_configure():
    """Read the capture settings once; (None, ()) when capture is off."""
    import importlib
    import os

    if not os.environ.get("HS_CAPTURE_STAGING_DIR"):
        return None, ()
    try:
        hook = importlib.import_module("hs_dataset.server_patch.legacy.hook")
    except ImportError as exc:
        raise RuntimeError(
            "hs_dataset: HS_CAPTURE_STAGING_DIR is set (hidden-state capture requested) but "
            "hs_dataset.server_patch.legacy.hook cannot be imported in the SGLang server's "
            "Python (%r). Install hs_dataset into the server environment, or unset "
            "HS_CAPTURE_STAGING_DIR to serve without capture." % (exc,)
        ) from exc
    if not callable(getattr(hook, "on_forward", None)):
        raise RuntimeError("hs_dataset: %s has no on_forward(); update hs_dataset" % hook.__name__)
    raw = os.environ.get("HS_CAPTURE_LAYER_IDS", "")
    try:
        layer_ids = tuple(sorted(int(x) for x in raw.split(",") if x.strip()))
    except ValueError:
        layer_ids = ()
    if not layer_ids or layer_ids[0] < 0 or len(set(layer_ids)) != len(layer_ids):
        raise RuntimeError(
            "hs_dataset: HS_CAPTURE_LAYER_IDS=%r must list distinct non-negative HF "
            "hidden_states indexes, comma-separated, e.g. 2,30,58" % (raw,)
        )
    return hook, layer_ids


def _hs_dataset_begin(forward_batch):
    """Layer ids to capture in this forward pass; () when capture is off or unwanted."""
    global _HS_DATASET_STATE
    if _HS_DATASET_STATE is None:
        _HS_DATASET_STATE = _hs_dataset_configure()
    hook, layer_ids = _HS_DATASET_STATE
    if hook is None:
        return ()
    wants = getattr(hook, "wants", None)
    if wants is not None:
        return layer_ids if wants(forward_batch) else ()
    return layer_ids if forward_batch.forward_mode.name == "EXTEND" else ()


def _hs_dataset_emit(forward_batch, layer_ids, captured, hidden_states, residual):
    """Hand the captured aux states and the pre-norm final state to the hook."""
    missing = [i for i in layer_ids if i not in captured]
    if missing:
        raise RuntimeError(
            "hs_dataset: layers %s were not captured in this forward pass (captured %s). "
            "HS_CAPTURE_LAYER_IDS must be below the number of decoder layers (the final "
            "state is passed separately); two-batch overlap and pipeline parallelism run "
            "layers outside the patched loop: drop --enable-two-batch-overlap, use "
            "--pp-size 1." % (missing, sorted(captured))
        )
    prenorm_final = hidden_states.clone() if residual is None else hidden_states + residual
    aux_states = [captured[i] for i in layer_ids]
    _HS_DATASET_STATE[0].on_forward(forward_batch, aux_states, prenorm_final, list(layer_ids))


'''

# The three statements inserted into DeepseekV2Model.forward.  A fresh tensor is
# captured every time: at layer 0 `hidden_states` (residual is None) becomes the
# residual that the fused add-RMSNorm of layer 0 updates in place, so it must be
# cloned; for i > 0 the sum is already a new tensor.
STMT_BEGIN = "_hs_ids, _hs_aux = _hs_dataset_begin(forward_batch), {}"
STMT_CAPTURE = "if {i} in _hs_ids: _hs_aux[{i}] = hidden_states.clone() if residual is None else hidden_states + residual"
STMT_EMIT = "if _hs_ids: _hs_dataset_emit(forward_batch, _hs_ids, _hs_aux, hidden_states, residual)"

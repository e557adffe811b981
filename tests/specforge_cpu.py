"""Run SpecForge 0.2.0's own EAGLE-3 training step on CPU, for tests. Installed files are never edited.

SpecForge trains on CUDA; three things stand between its step and a CPU, and each is
patched here at runtime, nothing else:

* ``specforge/core/loss.py`` imports Triton at module level and its ``LogSoftmaxLoss``
  is a Triton kernel. :func:`install` puts a minimal ``triton`` stand-in in
  ``sys.modules`` only while that module imports and only when Triton is absent
  (enough for its decorators; no kernel ever runs) and replaces ``LogSoftmaxLoss`` where the EAGLE-3 model looks it up
  with the same computation through plain torch autograd, using the file's own plain-torch reference
  ``_compute_loss`` (left uncompiled: ``torch.compile`` needs a C++ toolchain on CPU).
* ``SPECFORGE_DEVICE=cpu`` selects the CPU in ``specforge.utils.get_local_device``.
* ``TargetHead.load_weights`` (``modeling/target/target_head.py``) accepts only sharded
  checkpoints (a ``*.index.json``); :func:`sharded_view` makes a directory of links to
  a single-file model plus that index.

Everything else (draft model, TTT forward, target head in bfloat16, offline reader,
normalizer, collator, strategy) is SpecForge's code, unchanged.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types
from pathlib import Path

import torch


def _triton_stand_in() -> types.ModuleType:
    """Just the names ``specforge.core.loss`` touches at import time (decorators, type names)."""
    triton = types.ModuleType("triton")
    language = types.ModuleType("triton.language")
    triton.jit = lambda fn=None, **_: fn if fn is not None else (lambda f: f)
    triton.next_power_of_2 = lambda n: 1 << max(0, int(n) - 1).bit_length()
    language.constexpr = object
    triton.language = language
    return triton


def _plain_loss() -> type:
    """``LogSoftmaxLoss`` with the same call and result, computed by SpecForge's own reference."""
    from specforge.core import loss as loss_mod

    reference = getattr(loss_mod._compute_loss, "_torchdynamo_orig_callable", loss_mod._compute_loss)

    class PlainLogSoftmaxLoss:
        @staticmethod
        def apply(logits: torch.Tensor, target: torch.Tensor, position_mask: torch.Tensor) -> torch.Tensor:
            return reference(logits, target, position_mask)

    return PlainLogSoftmaxLoss


def _import_loss_module_without_triton() -> None:
    """Import ``specforge.core.loss`` with the stand-in visible only during that import.

    During it ``torch.compile`` is the identity too: the module compiles its reference
    loss at import, which would pull torch's compiler (and its own Triton probe) in.
    """
    stand_in = _triton_stand_in()
    sys.modules["triton"], sys.modules["triton.language"] = stand_in, stand_in.language
    compile_ = torch.compile
    torch.compile = lambda fn=None, **_: fn if fn is not None else (lambda f: f)
    try:
        importlib.import_module("specforge.core.loss")
    finally:
        torch.compile = compile_
        del sys.modules["triton"], sys.modules["triton.language"]


def install() -> None:
    """Apply the CPU shims (idempotent). Call before building SpecForge models."""
    os.environ["SPECFORGE_DEVICE"] = "cpu"
    if importlib.util.find_spec("triton") is None:
        _import_loss_module_without_triton()
    from specforge.algorithms.eagle3 import model as eagle3_model

    eagle3_model.LogSoftmaxLoss = _plain_loss()


def sharded_view(model_dir: Path, out: Path) -> Path:
    """A directory SpecForge's ``TargetHead`` accepts: links to ``model_dir``'s files plus a ``model.safetensors.index.json``."""
    from safetensors import safe_open

    out.mkdir(parents=True, exist_ok=True)
    for item in model_dir.iterdir():
        link = out / item.name
        if not link.exists():
            link.symlink_to(item)
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        weight_map = {key: "model.safetensors" for key in f.keys()}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out

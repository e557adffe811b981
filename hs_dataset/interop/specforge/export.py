"""Export to SpecForge 0.2.0's offline EAGLE-3 data (``scripts/prepare_hidden_states.py`` output).

```
DEST/
  rows_0-2000/data_0.ckpt ... data_1999.ckpt      # torch.save of a dict (their format):
  rows_2000-4000/data_2000.ckpt ...               #   input_ids [T] int64, loss_mask [T] int64,
                                                  #   aux_hidden_state [1, T, K*H] (aux ascending, concatenated),
                                                  #   hidden_state [1, T, H] POST final norm,
                                                  #   sample_id (str; ignored by SpecForge, used by import)
  hs_dataset_export.json                          # what was exported, layer ids in both conventions
```

SpecForge's ``OfflineManifestReader`` lists every ``*.ckpt`` under the root (sorted);
its EAGLE-3 normalizer maps ``aux_hidden_state`` -> ``hidden_state`` (drafter input) and
``hidden_state`` -> ``target``, which goes straight to the lm_head: it must be the
state AFTER the final norm. Ours is stored pre-norm, so the export derives it with the
recorded norm weight and eps (float32, cast once to the stored dtype). SpecForge's
EAGLE-3 trains on exactly three aux layers.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import torch

from hs_dataset.errors import FormatError
from hs_dataset.interop.common import (
    ExportMismatchError,
    ExportReport,
    check_layer_convention,
    derive_post_norm,
    note_source_storage,
    select_aux_layers,
)
from hs_dataset.interop.exporting import ExportPlan, TrainerExporter, run_export
from hs_dataset.interop.settings import ExportSettings
from hs_dataset.interop.specforge.settings import SpecForgeExportSettings

__all__ = ["DEFAULT_GROUP_SIZE", "SPECFORGE_NUM_AUX", "SPECFORGE_TRAIN_DTYPE", "SpecForgeExporter", "ckpt_path", "export_specforge"]

DEFAULT_GROUP_SIZE = SpecForgeExportSettings.group_size
SPECFORGE_NUM_AUX = 3  # specforge.algorithms.model_providers.resolve_eagle_capture_layers: exactly three
SPECFORGE_TRAIN_DTYPE = torch.bfloat16  # specforge/modeling/target/target_head.py: the target head is always bf16


def _dtype_warning(dtype: torch.dtype) -> str:
    """The note a kept non-bfloat16 dtype gets: the files load, but SpecForge 0.2.0 cannot train on them."""
    name = str(dtype).replace("torch.", "")
    return (
        f"warning: states kept in {name}; SpecForge 0.2.0 cannot train on them (its TargetHead runs in bfloat16 and "
        f"its first step fails with 'expected m1 and m2 to have the same dtype'); export without --keep-dtype to train"
    )


def ckpt_path(dest: Path, idx: int, group_size: int = DEFAULT_GROUP_SIZE) -> Path:
    start = (idx // group_size) * group_size
    return dest / f"rows_{start}-{start + group_size}" / f"data_{idx}.ckpt"


def _final_norm(ds: Any) -> tuple[torch.Tensor | None, float | None]:
    """(weight, eps) to derive the post-norm state, or (None, None) when the data is post-norm already."""
    md = ds.manifest.metadata
    kind = md.final_state
    if kind == "post_norm":
        return None, None
    if kind != "pre_norm":
        raise ExportMismatchError(f"{ds.root}: unknown final_state {kind!r}; SpecForge needs a post-norm final state")
    norm_kind = (
        md.final_norm.kind if md.final_norm is not None else None
    ) or "rmsnorm"  # unrecorded: the RMSNorm every supported model has
    if norm_kind != "rmsnorm":
        raise ExportMismatchError(
            f"{ds.root}: the final norm is {norm_kind!r}; only an RMSNorm can be applied to derive SpecForge's post-norm state"
        )
    try:
        weight, eps = ds.final_norm()
    except (FormatError, KeyError, ValueError, TypeError) as exc:
        raise ExportMismatchError(
            f"{ds.root}: the final state is pre_norm but the final norm cannot be applied ({exc}); SpecForge's "
            "hidden_state must be post-norm, so the recorded norm weight and eps are required"
        ) from None
    if eps is None:
        raise ExportMismatchError(f"{ds.root}: the manifest records no final-norm eps; cannot derive the post-norm state")
    if tuple(weight.shape) != (int(ds.manifest.hidden_size),):
        raise ExportMismatchError(f"{ds.root}: final-norm weight has shape {tuple(weight.shape)}, hidden size is {ds.manifest.hidden_size}")
    return weight, float(eps)


def _valid_ckpt(
    path: Path, *, sample_id: str, input_ids: torch.Tensor, aux_shape: tuple[int, ...], hidden: int, dtype: torch.dtype
) -> bool:
    try:
        raw = torch.load(path, weights_only=True, mmap=True, map_location="cpu")
    except Exception:  # a truncated or foreign file: rewrite it
        return False
    try:
        t = int(input_ids.shape[0])
        return (
            isinstance(raw, dict)
            and raw.get("sample_id") == sample_id
            and tuple(raw["aux_hidden_state"].shape) == aux_shape
            and tuple(raw["hidden_state"].shape) == (1, t, hidden)
            and raw["aux_hidden_state"].dtype == dtype
            and raw["hidden_state"].dtype == dtype
            and tuple(raw["loss_mask"].shape) == (t,)
            and bool(torch.equal(raw["input_ids"], input_ids))
        )
    except (KeyError, AttributeError, TypeError):
        return False


class SpecForgeExporter(TrainerExporter):
    """SpecForge's hooks of the export loop: ``rows_{g}-{g+N}/data_{idx}.ckpt`` per sample, nothing else."""

    target = "specforge"
    sample_glob = "**/data_*.ckpt"  # SpecForge reads every *.ckpt under the root
    sample_prefix, sample_suffix = "data_", ".ckpt"
    settings: SpecForgeExportSettings

    def __init__(self, ds: Any, dest: Path, settings: ExportSettings) -> None:
        super().__init__(ds, dest, SpecForgeExportSettings.adopt(settings))

    def plan(self) -> ExportPlan:
        from hs_dataset.codecs.registry import get_encoding

        ds = self.ds
        check_layer_convention(ds, "SpecForge")
        self.positions, layer_ids = select_aux_layers(ds, self.settings.aux_layer_ids, "SpecForge")
        _check_layer_ids(ds, layer_ids)
        self.weight, self.eps = _final_norm(ds)
        self.hidden = int(ds.manifest.hidden_size)
        self.num_layers = ds.manifest.metadata.num_hidden_layers
        stored_dtype = get_encoding(ds.manifest.state_encoding).decoded_dtype
        self.out_dtype = stored_dtype if self.settings.keep_dtype else SPECFORGE_TRAIN_DTYPE
        self.layer_ids, self.specforge_ids = layer_ids, [i - 1 for i in layer_ids]
        dtype = str(self.out_dtype).replace("torch.", "")
        resume_key = {
            "target": "specforge",
            "source_dataset_id": ds.manifest.dataset_id,
            "aux_layer_ids": layer_ids,
            "group_size": self.settings.group_size,
            "dtype": dtype,
        }
        derived = " (derived from the stored pre-norm state with the recorded RMSNorm)" if self.weight is not None else " (stored)"
        self.hidden_state = "post_norm" + derived
        layers = {
            "aux_layer_ids_hf": layer_ids,
            "specforge_aux_hidden_state_layer_ids": self.specforge_ids,
            "convention": "HF hidden_states[k] = output of decoder layer k-1 = SpecForge/SGLang capture id k-1",
            "hidden_state": self.hidden_state,
            "final_norm_eps": self.eps,
            "num_hidden_layers": self.num_layers,
            "hidden_size": self.hidden,
            "dtype": dtype,
        }
        warned = (_dtype_warning(self.out_dtype),) if self.out_dtype != SPECFORGE_TRAIN_DTYPE else ()
        return ExportPlan(resume_key=resume_key, layers=layers, warnings=warned)

    def describe(self, report: ExportReport) -> None:
        note_source_storage(self.ds, report, self.out_dtype)
        report.layers = {
            "aux layers (HF hidden_states ids)": self.layer_ids,
            "SpecForge aux_hidden_state_layer_ids (output of layer i)": self.specforge_ids,
            "hidden_state": self.hidden_state,
        }
        if self.out_dtype != SPECFORGE_TRAIN_DTYPE:
            report.notes.append(_dtype_warning(self.out_dtype))
        if self.num_layers is not None:
            default = [1, int(self.num_layers) // 2 - 1, int(self.num_layers) - 4]
            if self.specforge_ids != default:
                report.notes.append(
                    f"aux layers differ from SpecForge's default {default} for L={self.num_layers}: set "
                    f"model.aux_hidden_state_layer_ids (or the draft config's eagle_config.eagle_aux_hidden_state_layer_ids) "
                    f"to {self.specforge_ids}"
                )

    def sample_path(self, idx: int) -> Path:
        return ckpt_path(self.dest, idx, self.settings.group_size)

    def is_complete(self, path: Path, sample: dict[str, Any]) -> bool:
        ids = sample["input_ids"]
        aux_shape = (1, int(ids.shape[0]), len(self.layer_ids) * self.hidden)
        return _valid_ckpt(
            path, sample_id=sample["sample_id"], input_ids=ids, aux_shape=aux_shape, hidden=self.hidden, dtype=self.out_dtype
        )

    def encode(self, sample: dict[str, Any]) -> list[memoryview | bytes]:
        ids = sample["input_ids"].clone()
        t, k, out_dtype = int(ids.shape[0]), len(self.layer_ids), self.out_dtype
        aux = sample["aux_hidden_states"][:, self.positions].to(out_dtype).reshape(t, k * self.hidden).unsqueeze(0).clone()
        final = sample["final_hidden_state"]
        post = (
            final.to(out_dtype).clone()
            if self.weight is None or self.eps is None
            else derive_post_norm(final, self.weight, self.eps, out_dtype)
        )
        # Every tensor is a fresh, compact copy: torch.save writes a view's WHOLE storage (here: the mapped shard).
        obj = {
            "input_ids": ids,
            "loss_mask": sample["loss_mask"].to(torch.int64).clone(),
            "aux_hidden_state": aux.contiguous(),
            "hidden_state": post.unsqueeze(0).contiguous().clone(),
            "sample_id": sample["sample_id"],
        }
        buf = io.BytesIO()
        torch.save(obj, buf)
        return [buf.getbuffer()]


def _check_layer_ids(ds: Any, layer_ids: list[int]) -> None:
    """SpecForge's EAGLE-3 trains on exactly three aux layers, each the output of a decoder layer."""
    if not ds.manifest.aux_layer_ids:
        raise ExportMismatchError(
            f"{ds.root}: holds the final state only (no aux layers; layer preset {ds.manifest.metadata.preset_name}), "
            f"but SpecForge's EAGLE-3 trains on exactly {SPECFORGE_NUM_AUX} aux layers: capture with layers.preset: eagle3"
        )
    if len(layer_ids) != SPECFORGE_NUM_AUX:
        raise ExportMismatchError(
            f"SpecForge's EAGLE-3 trains on exactly {SPECFORGE_NUM_AUX} aux layers, the export would hold {len(layer_ids)} "
            f"({layer_ids}); pick three with --aux-layer-ids"
        )
    if min(layer_ids) < 1:
        raise ExportMismatchError(
            f"aux layer id 0 (the embedding output) has no SpecForge/SGLang capture id (those name the output of decoder "
            f"layer i, = HF hidden_states[i+1]); requested {layer_ids}"
        )


def export_specforge(
    src: str | os.PathLike,
    dest: str | os.PathLike,
    settings: ExportSettings = SpecForgeExportSettings(),
) -> ExportReport:
    """Export dataset ``src`` to ``dest`` in SpecForge 0.2.0's offline data layout.

    States are written in bfloat16 by default: SpecForge 0.2.0's ``TargetHead`` always
    runs in bfloat16 (``modeling/target/target_head.py``) and nothing autocasts, so any
    other dtype fails its first step. ``settings.keep_dtype``
    (:class:`SpecForgeExportSettings`) keeps the stored dtype (with a warning in the
    report) for readers other than SpecForge's trainer; the common
    :class:`~hs_dataset.interop.settings.ExportSettings` exports with SpecForge's defaults.
    """
    return run_export(SpecForgeExporter, src, dest, settings)

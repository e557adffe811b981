"""Export to the layout speculators 0.9.0's trainer reads (``speculators/train/data.py``).

```
DEST/
  data-00000-of-00001.arrow, dataset_info.json, state.json   # Arrow dataset (save_to_disk, torch format)
                                                              # columns input_ids, loss_mask (int64 lists), seq_len (int64),
                                                              # sample_id (string; ignored by speculators, used by import)
  hidden_states/hs_{idx}.safetensors                          # hidden_states [T, K+1, H], token_ids int64 [T]
  token_freq.pt                                               # {token id: count over loss-masked tokens} (speculators' vocab mapping input)
  final_norm.safetensors                                      # the recorded final norm weight, if any (for import)
  hs_dataset_export.json                                      # what was exported: layer ids, the --target-layer-ids to pass, source
```

``ArrowDataset`` loads ``hs_{idx}`` for Arrow row ``idx`` with ``FileTransfer.get_cached``
and uses ``hidden_states[:, :-1].flatten(1)`` as the aux states and
``hidden_states[:, -1]`` as ``verifier_last_hidden_states``, the final state BEFORE the
verifier's norm (its trainer applies ``verifier_norm`` itself). Its layer ids are HF
``hidden_states`` indexes with the final as id L = num_hidden_layers, default
``[2, L//2, L-3, L]``: the same convention as ours, so the stored pre-norm data maps
one to one. Post-norm data is refused (the norm cannot be undone).

speculators reads no layer record from the data directory: the trainer takes the aux
ids from ``--target-layer-ids`` (default ``[2, L//2, L-3]``). The export record says
which ids to pass, with the type the dataset's layer preset captured for and the
verifier (``layers.train_flags``). A dataset of the final state only exports
``hidden_states`` ``[T, 1, H]``, which speculators' MTP trains on.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from hs_dataset.errors import FormatError, IntegrityError
from hs_dataset.formats.encoding import tensor_bytes
from hs_dataset.interop.common import (
    ExportMismatchError,
    ExportReport,
    check_layer_convention,
    note_source_storage,
    num_hidden_layers,
    select_aux_layers,
    temp_path,
    trainer_default_aux_layer_ids,
    write_file_atomic,
)
from hs_dataset.interop.exporting import ExportPlan, TrainerExporter, run_export
from hs_dataset.interop.settings import ExportSettings
from hs_dataset.interop.speculators.launch import dataset_facts, dataset_flags
from hs_dataset.interop.speculators.settings import SpeculatorsExportSettings

__all__ = [
    "HIDDEN_STATES_DIR",
    "SpeculatorsExporter",
    "check_final_state",
    "export_speculators",
    "hs_file_name",
    "token_frequencies",
    "write_arrow_index",
    "write_token_freq",
]

HIDDEN_STATES_DIR = "hidden_states"
_ARROW_INDEX_FILES = ("state.json", "dataset_info.json")
_META_SAMPLE_ID = "hs_dataset.sample_id"
_META_SOURCE = "hs_dataset.source_dataset_id"


def hs_file_name(idx: int) -> str:
    return f"hs_{idx}.safetensors"


def check_final_state(ds: Any) -> None:
    kind = ds.manifest.metadata.final_state
    if kind != "pre_norm":
        raise ExportMismatchError(
            f"{ds.root}: the stored final state is {kind!r}, but speculators' trainer needs the PRE-norm final state "
            "(hidden_states[:, -1] goes through its own verifier_norm before lm_head); a post-norm state cannot be "
            "turned back into the pre-norm one. Recapture with layers.final: pre_norm"
        )


def token_frequencies(input_ids: Sequence[torch.Tensor], loss_masks: Sequence[torch.Tensor]) -> dict[int, int]:
    """{token id: count over loss-masked tokens}, sorted by id: what speculators' ``prepare-data`` writes to token_freq.pt."""
    freq: dict[int, int] = {}
    for ids, mask in zip(input_ids, loss_masks):
        uniq, counts = ids[mask.bool()].unique(return_counts=True)
        for tok, n in zip(uniq.tolist(), counts.tolist()):
            freq[tok] = freq.get(tok, 0) + n
    return dict(sorted(freq.items()))


def write_token_freq(dest: Path, freq: dict[int, int]) -> None:
    """``dest/token_freq.pt`` in speculators' own format (``torch.load(weights_only=True)`` of {int: int}), atomically."""
    import io

    buf = io.BytesIO()
    torch.save(dict(sorted(freq.items())), buf)
    write_file_atomic(dest / "token_freq.pt", [buf.getbuffer()])


def _encode_hs_file(hidden_states: torch.Tensor, token_ids: torch.Tensor, sample_id: str, dataset_id: str) -> list[memoryview | bytes]:
    from hs_dataset.codecs.safetensors_header import dump_header
    from hs_dataset.formats.encoding import safetensors_dtype

    entries = [
        ("token_ids", "I64", tuple(token_ids.shape), token_ids.numel() * 8),
        (
            "hidden_states",
            safetensors_dtype(hidden_states.dtype),
            tuple(hidden_states.shape),
            hidden_states.numel() * hidden_states.element_size(),
        ),
    ]
    header, order = dump_header(entries, {_META_SAMPLE_ID: sample_id, _META_SOURCE: dataset_id})
    data = {"token_ids": tensor_bytes(token_ids), "hidden_states": tensor_bytes(hidden_states)}
    return [header] + [data[name] for name in order]


def _valid_hs_file(path: Path, *, sample_id: str, input_ids: torch.Tensor, shape: tuple[int, ...], dtype: str) -> bool:
    """A file from an earlier run is kept only if its header, size, sample and tokens are right."""
    from hs_dataset.codecs.safetensors_layout import read_header

    try:
        with open(path, "rb") as f:
            specs, meta, data_start = read_header(f, str(path))
            size = os.fstat(f.fileno()).st_size
            if set(specs) != {"hidden_states", "token_ids"} or meta.get(_META_SAMPLE_ID) != sample_id:
                return False
            hs, tok = specs["hidden_states"], specs["token_ids"]
            if hs.dtype != dtype or hs.shape != shape or tok.dtype != "I64" or tok.shape != (shape[0],):
                return False
            if data_start + max(hs.end, tok.end) != size:
                return False
            f.seek(data_start + tok.begin)
            raw = f.read(tok.nbytes)
        stored = torch.frombuffer(bytearray(raw), dtype=torch.int64) if raw else torch.empty(0, dtype=torch.int64)
        return bool(torch.equal(stored, input_ids.to(torch.int64)))
    except (OSError, FormatError, ValueError):
        return False


def write_arrow_index(dest: Path, input_ids: list[torch.Tensor], loss_masks: list[torch.Tensor], sample_ids: list[str]) -> None:
    """``save_to_disk`` into a temp dir, then move the files in; ``state.json`` (what ``load_from_disk`` opens) last."""
    import datasets
    import numpy as np
    import pyarrow as pa

    from hs_dataset.formats.atomic import fsync_dir

    def list_column(parts: list[torch.Tensor]) -> pa.Array:
        lengths = np.array([int(p.shape[0]) for p in parts], dtype=np.int64)
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.concatenate([p.numpy().astype(np.int64, copy=False) for p in parts]) if parts else np.zeros(0, np.int64)
        return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values)).cast(pa.list_(pa.int64()))

    table = pa.table(
        {
            "input_ids": list_column(input_ids),
            "loss_mask": list_column(loss_masks),
            "seq_len": pa.array([int(p.shape[0]) for p in input_ids], type=pa.int64()),
            "sample_id": pa.array(sample_ids, type=pa.string()),
        }
    )
    dataset = datasets.Dataset(table)
    dataset.set_format(type="torch")
    staging = temp_path(dest / "arrow")
    bars_were_off = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        dataset.save_to_disk(str(staging))
    finally:
        if not bars_were_off:
            datasets.enable_progress_bars()
    try:
        for name in _ARROW_INDEX_FILES:  # the index goes first, so a crash below leaves no loadable stale index
            try:
                os.unlink(dest / name)
            except FileNotFoundError:
                pass
        for old in dest.glob("data-*.arrow"):
            old.unlink()
        fsync_dir(dest)
        produced = sorted(os.listdir(staging))
        ordered = [n for n in produced if n not in _ARROW_INDEX_FILES] + [n for n in ("dataset_info.json", "state.json") if n in produced]
        for name in ordered:
            with open(staging / name, "rb") as f:
                os.fsync(f.fileno())
            os.replace(staging / name, dest / name)
            fsync_dir(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _copy_final_norm(ds: Any, dest: Path) -> dict[str, Any] | None:
    """Keep the recorded final norm next to the export (speculators ignores it; ``import`` reads it back)."""
    from hs_dataset.formats.shard_layout import NORM_WEIGHT_FILE, NORM_WEIGHT_KEY

    try:
        weight, eps = ds.final_norm()
    except IntegrityError:
        raise  # a corrupted or linked-out norm file is an error, not "no norm recorded"
    except (FormatError, KeyError, ValueError, TypeError):
        return None
    from hs_dataset.codecs.safetensors_header import dump_header
    from hs_dataset.formats.encoding import safetensors_dtype

    weight = weight.detach().to("cpu").contiguous()
    header, _ = dump_header(
        [(NORM_WEIGHT_KEY, safetensors_dtype(weight.dtype), tuple(weight.shape), weight.numel() * weight.element_size())], {}
    )
    write_file_atomic(dest / NORM_WEIGHT_FILE, [header, tensor_bytes(weight)])
    return {"kind": "rmsnorm", "eps": eps, "weight_file": NORM_WEIGHT_FILE, "weight_key": NORM_WEIGHT_KEY}


class SpeculatorsExporter(TrainerExporter):
    """speculators' hooks of the export loop: ``hidden_states/hs_{idx}.safetensors`` per sample; the Arrow
    index, ``token_freq.pt`` and the final norm once every sample file is written."""

    target = "speculators"
    sample_glob = f"{HIDDEN_STATES_DIR}/hs_*.safetensors"
    sample_prefix, sample_suffix = "hs_", ".safetensors"
    settings: SpeculatorsExportSettings

    def __init__(self, ds: Any, dest: Path, settings: ExportSettings) -> None:
        super().__init__(ds, dest, SpeculatorsExportSettings.adopt(settings))
        self.input_ids: list[torch.Tensor] = []
        self.loss_masks: list[torch.Tensor] = []
        self.sample_ids: list[str] = []

    def plan(self) -> ExportPlan:
        from hs_dataset.codecs.registry import get_encoding
        from hs_dataset.formats.encoding import safetensors_dtype

        ds = self.ds
        check_layer_convention(ds, "speculators")
        check_final_state(ds)
        self.positions, layer_ids = select_aux_layers(ds, self.settings.aux_layer_ids, "speculators")
        num_layers = num_hidden_layers(ds, self.settings.num_hidden_layers, "speculators")
        bad = [i for i in layer_ids if not 0 <= i < num_layers]
        if bad:
            raise ExportMismatchError(
                f"aux layer id(s) {bad} are outside 0..{num_layers - 1}: in speculators' convention id k is the input of "
                f"decoder layer k (HF hidden_states[k]) and id {num_layers} is the pre-norm final state, stored last"
            )
        self.hidden = int(ds.manifest.hidden_size)
        self.out_dtype = get_encoding(ds.manifest.state_encoding).decoded_dtype
        self.file_dtype = safetensors_dtype(self.out_dtype)
        self.layer_ids, self.num_layers = layer_ids, num_layers
        self.defaults = trainer_default_aux_layer_ids(num_layers)  # the final is id num_layers
        self.flags = dataset_flags(replace(dataset_facts(ds.manifest), aux_layer_ids=layer_ids))
        resume_key = {
            "target": "speculators",
            "source_dataset_id": ds.manifest.dataset_id,
            "aux_layer_ids": layer_ids,
            "num_hidden_layers": num_layers,
            "token_freq": bool(self.settings.token_freq),
        }
        layers = {
            "target_layer_ids": layer_ids,
            "hidden_states_layer_ids": layer_ids + [num_layers],
            "final_layer_id": num_layers,
            "final_state": "pre_norm",
            "num_hidden_layers": num_layers,
            "hidden_size": self.hidden,
            "convention": "speculators: id k = HF hidden_states[k] (input of decoder layer k); id L = final state before the norm",
            "speculators_default_target_layer_ids": self.defaults,
            "train_flag": "--target-layer-ids " + " ".join(map(str, layer_ids)) if layer_ids else "",
            "train_flags": self.flags,  # what the dataset knows: type (its layer preset), layers, verifier
            "layer_preset": None if ds.manifest.metadata.layer_preset is None else ds.manifest.metadata.layer_preset.to_json(),
        }
        return ExportPlan(resume_key=resume_key, layers=layers)

    def describe(self, report: ExportReport) -> None:
        layer_ids = self.layer_ids
        report.layers = {
            "hidden_states layers (aux ascending, final last)": layer_ids + [self.num_layers],
            "pass to speculators train": " ".join(self.flags) + f" --data-path {self.dest}",
        }
        if not layer_ids:
            report.notes.append(
                "the final state only (hidden_states [T, 1, H]): only speculators' MTP trains on it (--speculator-type mtp)"
            )
        elif layer_ids != self.defaults:
            report.notes.append(
                f"aux layers {layer_ids} differ from speculators' default {self.defaults} for L={self.num_layers}: "
                f"train with --target-layer-ids {' '.join(map(str, layer_ids))} (speculators otherwise assumes the default silently, with a warning)"
            )
        note_source_storage(self.ds, report, self.out_dtype)

    def begin(self) -> None:
        (self.dest / HIDDEN_STATES_DIR).mkdir(exist_ok=True)

    def observe(self, sample: dict[str, Any]) -> None:
        self.input_ids.append(sample["input_ids"].clone())
        self.loss_masks.append(sample["loss_mask"].to(torch.int64))
        self.sample_ids.append(sample["sample_id"])

    def sample_path(self, idx: int) -> Path:
        return self.dest / HIDDEN_STATES_DIR / hs_file_name(idx)

    def is_complete(self, path: Path, sample: dict[str, Any]) -> bool:
        ids = sample["input_ids"]
        shape = (int(ids.shape[0]), len(self.layer_ids) + 1, self.hidden)
        return _valid_hs_file(path, sample_id=sample["sample_id"], input_ids=ids, shape=shape, dtype=self.file_dtype)

    def encode(self, sample: dict[str, Any]) -> list[memoryview | bytes]:
        aux = sample["aux_hidden_states"][:, self.positions]
        final = sample["final_hidden_state"]
        states = torch.cat([aux, final.unsqueeze(1)], dim=1).to(self.out_dtype).contiguous()
        return _encode_hs_file(states, sample["input_ids"].clone(), sample["sample_id"], self.ds.manifest.dataset_id)

    def finish(self, record: dict[str, Any]) -> None:
        record["final_norm"] = _copy_final_norm(self.ds, self.dest)
        if self.settings.token_freq:
            write_token_freq(self.dest, token_frequencies(self.input_ids, self.loss_masks))
        write_arrow_index(self.dest, self.input_ids, self.loss_masks, self.sample_ids)


def export_speculators(
    src: str | os.PathLike,
    dest: str | os.PathLike,
    settings: ExportSettings = SpeculatorsExportSettings(),
) -> ExportReport:
    """Export dataset ``src`` to ``dest`` in speculators 0.9.0's offline training layout.

    ``settings`` (:class:`SpeculatorsExportSettings`, or the common
    :class:`~hs_dataset.interop.settings.ExportSettings` for speculators' defaults):
    ``aux_layer_ids`` (HF ``hidden_states`` ids) picks stored aux layers, default all;
    ``num_hidden_layers`` is L when the manifest does not record it.
    """
    return run_export(SpeculatorsExporter, src, dest, settings)

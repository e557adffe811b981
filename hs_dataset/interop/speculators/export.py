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
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import torch

from hs_dataset.errors import FormatError, IntegrityError
from hs_dataset.formats.encoding import tensor_bytes
from hs_dataset.interop.settings import ExportSettings
from hs_dataset.interop.speculators.launch import dataset_facts, dataset_flags
from hs_dataset.interop.common import (
    ExportMismatchError,
    ExportReport,
    base_record,
    check_layer_convention,
    num_hidden_layers,
    note_source_storage,
    prepare_destination,
    quarantined_count,
    remove_temp_files,
    select_aux_layers,
    temp_path,
    trainer_default_aux_layer_ids,
    write_export_record,
    write_file_atomic,
)

__all__ = [
    "export_speculators",
    "HIDDEN_STATES_DIR",
    "hs_file_name",
    "check_final_state",
    "token_frequencies",
    "write_token_freq",
    "write_arrow_index",
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
    from hs_dataset.formats.encoding import safetensors_dtype
    from hs_dataset.codecs.safetensors_header import dump_header

    entries = [
        ("token_ids", "I64", tuple(token_ids.shape), token_ids.numel() * 8),
        ("hidden_states", safetensors_dtype(hidden_states.dtype), tuple(hidden_states.shape), hidden_states.numel() * hidden_states.element_size()),
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
    from hs_dataset.formats.encoding import safetensors_dtype
    from hs_dataset.codecs.safetensors_header import dump_header

    weight = weight.detach().to("cpu").contiguous()
    header, _ = dump_header([(NORM_WEIGHT_KEY, safetensors_dtype(weight.dtype), tuple(weight.shape), weight.numel() * weight.element_size())], {})
    write_file_atomic(dest / NORM_WEIGHT_FILE, [header, tensor_bytes(weight)])
    return {"kind": "rmsnorm", "eps": eps, "weight_file": NORM_WEIGHT_FILE, "weight_key": NORM_WEIGHT_KEY}


def export_speculators(
    src: str | os.PathLike,
    dest: str | os.PathLike,
    settings: ExportSettings = ExportSettings(),
) -> ExportReport:
    """Export dataset ``src`` to ``dest`` in speculators 0.9.0's offline training layout.

    ``settings.aux_layer_ids`` (HF ``hidden_states`` ids) picks stored aux layers, default
    all; ``settings.num_hidden_layers`` is L when the manifest does not record it.
    """
    from hs_dataset.formats.reader import open_dataset

    src, dest = Path(src), Path(dest)
    aux_layer_ids, token_freq, overwrite = settings.aux_layer_ids, settings.token_freq, settings.overwrite
    ds = open_dataset(src, verify_hashes=settings.verify_hashes)
    check_layer_convention(ds, "speculators")
    check_final_state(ds)
    positions, layer_ids = select_aux_layers(ds, aux_layer_ids, "speculators")
    num_layers = num_hidden_layers(ds, settings.num_hidden_layers, "speculators")
    bad = [i for i in layer_ids if not 0 <= i < num_layers]
    if bad:
        raise ExportMismatchError(
            f"aux layer id(s) {bad} are outside 0..{num_layers - 1}: in speculators' convention id k is the input of "
            f"decoder layer k (HF hidden_states[k]) and id {num_layers} is the pre-norm final state, stored last"
        )
    hidden = int(ds.manifest.hidden_size)
    defaults = trainer_default_aux_layer_ids(num_layers)  # the final is id num_layers
    flags = dataset_flags(replace(dataset_facts(ds.manifest), aux_layer_ids=layer_ids))
    resume_key = {
        "target": "speculators",
        "source_dataset_id": ds.manifest.dataset_id,
        "aux_layer_ids": layer_ids,
        "num_hidden_layers": num_layers,
        "token_freq": bool(token_freq),
    }
    resumed = prepare_destination(src, dest, target="speculators", resume_key=resume_key, overwrite=overwrite)
    report = ExportReport(target="speculators", source=str(src), dest=str(dest), resumed=resumed)
    report.quarantined_not_exported = quarantined_count(ds)
    layers = {
        "target_layer_ids": layer_ids,
        "hidden_states_layer_ids": layer_ids + [num_layers],
        "final_layer_id": num_layers,
        "final_state": "pre_norm",
        "num_hidden_layers": num_layers,
        "hidden_size": hidden,
        "convention": "speculators: id k = HF hidden_states[k] (input of decoder layer k); id L = final state before the norm",
        "speculators_default_target_layer_ids": defaults,
        "train_flag": "--target-layer-ids " + " ".join(map(str, layer_ids)) if layer_ids else "",
        "train_flags": flags,  # what the dataset knows: type (its layer preset), layers, verifier
        "layer_preset": None if ds.manifest.metadata.layer_preset is None else ds.manifest.metadata.layer_preset.to_json(),
    }
    report.layers = {
        "hidden_states layers (aux ascending, final last)": layers["hidden_states_layer_ids"],
        "pass to speculators train": " ".join(flags) + f" --data-path {dest}",
    }
    if not layer_ids:
        report.notes.append("the final state only (hidden_states [T, 1, H]): only speculators' MTP trains on it (--speculator-type mtp)")
    elif layer_ids != defaults:
        report.notes.append(
            f"aux layers {layer_ids} differ from speculators' default {defaults} for L={num_layers}: "
            f"train with {layers['train_flag']} (speculators otherwise assumes the default silently, with a warning)"
        )
    record = base_record(ds, "speculators", resume_key, {"layers": layers, "samples": len(ds)})
    write_export_record(dest, record)
    remove_temp_files(dest)

    hs_dir = dest / HIDDEN_STATES_DIR
    hs_dir.mkdir(exist_ok=True)
    decoded = ds.manifest.state_encoding
    from hs_dataset.formats.encoding import safetensors_dtype
    from hs_dataset.codecs.registry import get_encoding

    out_dtype = get_encoding(decoded).decoded_dtype
    note_source_storage(ds, report, out_dtype)
    all_ids: list[torch.Tensor] = []
    all_masks: list[torch.Tensor] = []
    sample_ids: list[str] = []
    for idx, sample in enumerate(ds):
        ids = sample["input_ids"].clone()
        mask = sample["loss_mask"].to(torch.int64)
        t = int(ids.shape[0])
        all_ids.append(ids)
        all_masks.append(mask)
        sample_ids.append(sample["sample_id"])
        report.samples += 1
        report.tokens += t
        path = hs_dir / hs_file_name(idx)
        shape = (t, len(layer_ids) + 1, hidden)
        if path.exists():
            if _valid_hs_file(path, sample_id=sample["sample_id"], input_ids=ids, shape=shape, dtype=safetensors_dtype(out_dtype)):
                report.files_skipped += 1
                continue
            report.files_rewritten += 1
        aux = sample["aux_hidden_states"][:, positions]
        final = sample["final_hidden_state"]
        states = torch.cat([aux, final.unsqueeze(1)], dim=1).to(out_dtype).contiguous()
        report.bytes_written += write_file_atomic(path, _encode_hs_file(states, ids, sample["sample_id"], ds.manifest.dataset_id))
        report.files_written += 1
    for stale in hs_dir.glob("hs_*.safetensors"):  # files beyond the source's samples (never ours to keep)
        stem = stale.name[len("hs_") : -len(".safetensors")]
        if stem.isdigit() and int(stem) >= report.samples:
            stale.unlink()
    record["final_norm"] = _copy_final_norm(ds, dest)
    if token_freq:
        write_token_freq(dest, token_frequencies(all_ids, all_masks))
    write_arrow_index(dest, all_ids, all_masks, sample_ids)
    record.update(status="complete", samples=report.samples, tokens=report.tokens)
    write_export_record(dest, record)
    return report

"""Import a speculators or SpecForge offline-data directory into our format (through ShardWriter).

Neither layout records what its states mean, so an import states it:

* speculators 0.9.0 (``hidden_states/hs_{idx}.safetensors`` + Arrow dataset): the last
  of ``hidden_states``' layers is the final state BEFORE the norm -> stored
  ``final_state: "pre_norm"``; the others are aux layers, HF ``hidden_states`` indexes
  (speculators uses the same convention; default ``[2, L//2, L-3]``).
* SpecForge 0.2.0 (``rows_*/data_{idx}.ckpt``): ``hidden_state`` is AFTER the final norm
  -> stored ``final_state: "post_norm"`` (a different dataset identity than a pre-norm
  capture, on purpose); ``aux_hidden_state`` is K aux layers concatenated, HF ids = the
  SGLang capture ids + 1 (default ``[2, L//2, L-3]``).

Where the layer ids come from, first match wins: ``aux_layer_ids=``; the
``hs_dataset_export.json`` record if the directory is one of our exports; the config
card named by ``config`` (if it is a card); speculators'/SpecForge's default from
``num_hidden_layers``. Contradictions between these, or with the files, are refused.

Inconsistent files are refused by name: missing keys, shape mismatches between
tensors or with the first file, token_ids != input_ids, mixed dtypes. ``.ckpt`` files
are read with ``torch.load(..., weights_only=True)`` only: never an arbitrary unpickle;
``.ckpt.gz`` files are expanded with a size cap (:mod:`hs_dataset.interop.bounded_gzip`),
so a gzip bomb is refused with its name instead of filling memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from hs_dataset.dtypes import state_dtype_name
from hs_dataset.errors import HsDatasetError
from hs_dataset.formats.atomic import is_temp_name
from hs_dataset.formats.paths import resolve_member
from hs_dataset.interop.bounded_gzip import CompressedInputError, gunzip_to_temp

__all__ = ["ImportError_", "ImportReport", "import_speculators", "import_specforge", "IMPORT_FORMATS"]

IMPORT_FORMATS = ("speculators", "specforge")


class ImportError_(HsDatasetError, ValueError):
    """An input directory or file cannot be imported (named in the message)."""


@dataclass
class ImportReport:
    source_format: str
    source: str
    dest: str
    files_read: int = 0
    samples_written: int = 0
    skipped_existing: int = 0
    skipped_missing: list[str] = field(default_factory=list)
    tokens_written: int = 0
    quarantined: list[dict[str, str]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        md = self.metadata
        lines = [
            f"imported {self.source_format} data {self.source} -> {self.dest}",
            f"  samples written   {self.samples_written} ({self.tokens_written} tokens); already stored {self.skipped_existing}",
            f"  aux layers        {md.get('aux_layer_ids')} (HF hidden_states indexes); final state {md.get('final_state')}",
            f"  dtype / hidden    {md.get('dtype')} / {md.get('hidden_size')}",
        ]
        if self.skipped_missing:
            lines.append(f"  missing files skipped: {len(self.skipped_missing)} (e.g. {self.skipped_missing[:3]})")
        for q in self.quarantined[:10]:
            lines.append(f"  quarantined {q['sample_id']}: {q['reason']}")
        return "\n".join(lines)


@dataclass
class _Settings:
    config_name: str
    config_fingerprint: str
    model: dict[str, Any]
    aux_layer_ids: list[int] | None
    num_hidden_layers: int | None
    norm_weight: torch.Tensor | None
    norm_eps: float | None
    card_dtype: str | None


# ---------------------------------------------------------------------------- settings
def _default_ids(num_layers: int) -> list[int]:
    return [2, num_layers // 2, num_layers - 3]


def _load_card_or_none(config: str) -> Any:
    from hs_dataset.config import CardError, load_card

    looks_like_path = Path(config).suffix in (".yaml", ".yml")
    try:
        return load_card(config)
    except CardError as exc:
        if looks_like_path or "unknown config" not in str(exc):
            raise ImportError_(str(exc)) from None
        return None


def _record_of(src: Path, fmt: str) -> dict[str, Any] | None:
    from hs_dataset.interop.common import read_export_record

    record = read_export_record(src)
    return record if record and record.get("target") == fmt else None


def _settings(
    src: Path,
    fmt: str,
    *,
    config: str,
    aux_layer_ids: Sequence[int] | None,
    num_hidden_layers: int | None,
    model_path: str | None,
    model_id: str | None,
) -> _Settings:
    card = _load_card_or_none(config)
    record = _record_of(src, fmt)
    layers = (record or {}).get("layers") or {}
    sources: list[tuple[str, list[int]]] = []
    if aux_layer_ids is not None:
        sources.append(("--aux-layer-ids", [int(i) for i in aux_layer_ids]))
    recorded_ids = layers.get("target_layer_ids") or layers.get("aux_layer_ids_hf")
    if recorded_ids is not None:
        sources.append((f"{src}/hs_dataset_export.json", [int(i) for i in recorded_ids]))
    if card is not None:
        sources.append((f"config {card.name}", list(card.layers.aux)))
    # The explicit value and the export record describe the files; they must agree.
    hard = [s for s in sources if not s[0].startswith("config ")]
    if len({tuple(ids) for _, ids in hard}) > 1:
        raise ImportError_("layer ids disagree: " + "; ".join(f"{where} says {ids}" for where, ids in hard))
    norm_weight = norm_eps = None
    model: dict[str, Any] = {"path": None, "id": model_id, "revision": None, "fingerprint": None}
    if card is not None:
        model.update(path=card.model.path, id=model_id or card.model.id, revision=card.model.revision)
    source_model = ((record or {}).get("source") or {}).get("model")
    if isinstance(source_model, dict) and model_path is None:
        model.update({k: source_model.get(k) for k in ("path", "id", "revision", "fingerprint")})
    if model_path is not None:
        from hs_dataset.model.snapshot import load_text_config, model_fingerprint, read_final_norm, resolve_model_path

        local = resolve_model_path(model_path)
        model.update(path=str(local), fingerprint=model_fingerprint(local))
        weight, eps = read_final_norm(local)
        norm_weight, norm_eps = weight, float(eps)  # type: ignore[assignment]
        model_layers = load_text_config(local).get("num_hidden_layers")
        if num_hidden_layers is not None and model_layers is not None and int(model_layers) != int(num_hidden_layers):
            raise ImportError_(f"--num-hidden-layers {num_hidden_layers} contradicts {local}/config.json ({model_layers})")
        num_hidden_layers = num_hidden_layers or model_layers
    recorded_layers = layers.get("num_hidden_layers")
    if num_hidden_layers is not None and recorded_layers is not None and int(recorded_layers) != int(num_hidden_layers):
        raise ImportError_(f"num_hidden_layers {num_hidden_layers} contradicts {src}/hs_dataset_export.json ({recorded_layers})")
    num_hidden_layers = num_hidden_layers if num_hidden_layers is not None else recorded_layers
    if norm_weight is None and fmt == "speculators":
        norm = (record or {}).get("final_norm")
        if isinstance(norm, dict) and "weight_file" in norm:
            norm_weight, norm_eps = _recorded_norm(src, norm)
    ids = sources[0][1] if sources else (_default_ids(int(num_hidden_layers)) if num_hidden_layers else None)
    if card is not None:
        fingerprint = card.fingerprint
        name = card.name
    else:
        name = config
        fingerprint = hashlib.sha256(json.dumps({"import": fmt, "config": config}, sort_keys=True).encode()).hexdigest()
    return _Settings(
        config_name=name,
        config_fingerprint=fingerprint,
        model=model,
        aux_layer_ids=ids,
        num_hidden_layers=int(num_hidden_layers) if num_hidden_layers is not None else None,
        norm_weight=norm_weight,
        norm_eps=norm_eps,
        card_dtype=card.dtype if card is not None else None,
    )


def _recorded_norm(src: Path, norm: dict[str, Any]) -> tuple[torch.Tensor | None, float | None]:
    """The final norm an export record names (through the one norm reader: no links, inside ``src``)."""
    from hs_dataset.formats.reader import load_norm_weight

    where = str(src / "hs_dataset_export.json")
    try:
        weight = load_norm_weight(src, norm, where=where)
    except FileNotFoundError:
        return None, None
    eps = norm.get("eps")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < 1:
        raise ImportError_(f"{where}: final_norm.eps must be a small non-negative number, got {str(eps)[:40]}")
    return weight, float(eps)


def _metadata(settings: _Settings, fmt: str, src: Path, *, k: int, hidden: int, dtype: torch.dtype, where: str) -> dict[str, Any]:
    ids = settings.aux_layer_ids
    if ids is None:
        raise ImportError_(
            f"{where}: {k} aux layers, but nothing says which: pass --aux-layer-ids (HF hidden_states indexes) or "
            "--num-hidden-layers L for the trainer's default [2, L//2, L-3], or name a config card that lists them"
        )
    if len(ids) != k:
        raise ImportError_(f"{where}: the files hold {k} aux layers but the layer ids are {ids} ({len(ids)} layers)")
    if sorted(set(ids)) != ids or min(ids) < 0:
        raise ImportError_(f"aux layer ids {ids} must be ascending, distinct, non-negative HF hidden_states indexes")
    if settings.num_hidden_layers is not None and max(ids) >= settings.num_hidden_layers:
        raise ImportError_(f"aux layer ids {ids} reach past the {settings.num_hidden_layers} decoder layers (id L is the final state)")
    try:
        dtype_name = state_dtype_name(dtype)
    except ValueError:
        raise ImportError_(f"{where}: states are {dtype}; only bfloat16, float16 and float32 can be stored") from None
    if settings.card_dtype is not None and settings.card_dtype != dtype_name:
        raise ImportError_(
            f"{where}: states are {dtype_name} but config {settings.config_name!r} captures {settings.card_dtype}; "
            "name another config (or a free-form name with --aux-layer-ids)"
        )
    if settings.norm_weight is not None and tuple(settings.norm_weight.shape) != (hidden,):
        raise ImportError_(f"the final-norm weight has shape {tuple(settings.norm_weight.shape)}, the data's hidden size is {hidden}")
    md: dict[str, Any] = {
        "config_name": settings.config_name,
        "config_fingerprint": settings.config_fingerprint,
        "model": settings.model,
        "aux_layer_ids": ids,
        "layer_convention": "hf_hidden_states_index",
        "final_state": "pre_norm" if fmt == "speculators" else "post_norm",
        "dtype": dtype_name,
        "hidden_size": hidden,
        "num_hidden_layers": settings.num_hidden_layers,
        "backend": {"name": "import", "format": {"speculators": "speculators 0.9.0", "specforge": "specforge 0.2.0"}[fmt], "source": str(src)},
    }
    if settings.norm_eps is not None:
        md["final_norm"] = {"kind": "rmsnorm", "eps": settings.norm_eps}
    return md


def _prepare_dest(src: Path, dest: Path, overwrite: bool) -> None:
    src_r, dest_r = src.resolve(), dest.resolve()
    for a, b in ((dest_r, src_r), (src_r, dest_r)):
        if a == b or b in a.parents:
            raise ImportError_(f"destination {dest} overlaps the source {src}; import into a separate directory")
    if overwrite and dest.exists() and any(dest.iterdir()):
        from hs_dataset.interop.common import refuse_to_wipe_dataset

        refuse_to_wipe_dataset(dest)
        for entry in dest.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


# ---------------------------------------------------------------------------- the shared loop
def _run(
    fmt: str,
    src: Path,
    dest: Path,
    settings: _Settings,
    items: Iterator[tuple[str, str, Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]]],
    report: ImportReport,
    *,
    storage: str,
    shard_bytes: int | None,
) -> ImportReport:
    """``items`` yields (sample id, file name, loader -> (input_ids, loss_mask, aux [T,K,H], final [T,H]))."""
    from hs_dataset.formats.writer import ShardWriter
    from hs_dataset.sample import CapturedSample

    writer = None
    shape: tuple[int, int, torch.dtype] | None = None
    try:
        for sid, where, load in items:
            if writer is not None and writer.contains(sid):
                report.skipped_existing += 1
                continue
            ids, mask, aux, final = load()
            report.files_read += 1
            if shape is None:
                shape = (int(aux.shape[1]), int(aux.shape[2]), aux.dtype)
                md = _metadata(settings, fmt, src, k=shape[0], hidden=shape[1], dtype=shape[2], where=where)
                report.metadata = md
                kwargs: dict[str, Any] = {"final_norm_weight": settings.norm_weight, "storage": storage}
                if shard_bytes is not None:
                    kwargs["shard_bytes"] = shard_bytes
                writer = ShardWriter(dest, md, **kwargs)
                if writer.contains(sid):
                    report.skipped_existing += 1
                    continue
            elif (int(aux.shape[1]), int(aux.shape[2]), aux.dtype) != shape:
                raise ImportError_(
                    f"{where}: aux states are [T, {aux.shape[1]}, {aux.shape[2]}] {aux.dtype}, the first file's are "
                    f"[T, {shape[0]}, {shape[1]}] {shape[2]} (mixed layouts in one directory)"
                )
            sample = CapturedSample(sid, ids.to(torch.int64), mask.to(torch.bool), aux.contiguous(), final.contiguous())
            if writer.add(sample):  # type: ignore[union-attr]
                report.tokens_written += int(ids.shape[0])
        if writer is not None:
            wr = writer.close()
            report.samples_written = wr.written
            report.quarantined = list(wr.quarantined)
            report.tokens_written = wr.tokens
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    if writer is None and not report.skipped_missing:
        raise ImportError_(f"{src}: no {fmt} sample files found")
    return report


def _check_mask(mask: torch.Tensor, t: int, where: str) -> torch.Tensor:
    mask = mask.reshape(-1) if mask.dim() == 2 and mask.shape[0] == 1 else mask
    if mask.dim() != 1 or int(mask.shape[0]) != t:
        raise ImportError_(f"{where}: loss_mask has shape {tuple(mask.shape)}, input_ids has {t} tokens")
    if mask.dtype != torch.bool and bool(((mask != 0) & (mask != 1)).any()):
        raise ImportError_(f"{where}: loss_mask holds values other than 0/1")
    return mask


# ---------------------------------------------------------------------------- speculators
def import_speculators(
    src: str | os.PathLike,
    dest: str | os.PathLike,
    *,
    config: str,
    aux_layer_ids: Sequence[int] | None = None,
    num_hidden_layers: int | None = None,
    model_path: str | None = None,
    model_id: str | None = None,
    hidden_states_path: str | os.PathLike | None = None,
    skip_missing: bool = False,
    storage: str = "native",
    shard_bytes: int | None = None,
    overwrite: bool = False,
) -> ImportReport:
    """Import speculators 0.9.0 offline data (Arrow dataset + ``hidden_states/hs_{idx}.safetensors``)."""
    import datasets
    from safetensors import SafetensorError, safe_open

    src, dest = Path(src), Path(dest)
    if not (src / "state.json").is_file():
        raise ImportError_(f"{src}: no Arrow dataset (state.json missing); expected a `speculators prepare-data` output directory")
    # file names are ours, but the directory is untrusted: no links out of it (the one resolver)
    hs_root, hs_prefix = (Path(hidden_states_path), "") if hidden_states_path else (src, "hidden_states/")
    settings = _settings(src, "speculators", config=config, aux_layer_ids=aux_layer_ids, num_hidden_layers=num_hidden_layers, model_path=model_path, model_id=model_id)
    _prepare_dest(src, dest, overwrite)
    data = datasets.load_from_disk(str(src))
    missing_cols = {"input_ids", "loss_mask"} - set(data.column_names)
    if missing_cols:
        raise ImportError_(f"{src}: the Arrow dataset lacks column(s) {sorted(missing_cols)}")
    has_ids = "sample_id" in data.column_names
    sample_ids = list(data.with_format(None)["sample_id"]) if has_ids else None
    data = data.with_format("torch", columns=["input_ids", "loss_mask"])
    report = ImportReport("speculators", str(src), str(dest))

    def items() -> Iterator[tuple[str, str, Callable[[], Any]]]:
        for idx in range(len(data)):
            path = resolve_member(hs_root, f"{hs_prefix}hs_{idx}.safetensors", what="hidden states file", where=str(hs_root))
            sid = sample_ids[idx] if sample_ids is not None else f"speculators-{idx:08d}"
            if not path.is_file():
                if skip_missing:
                    report.skipped_missing.append(str(path))
                    continue
                raise ImportError_(f"{path}: missing (Arrow row {idx} has no hidden states); pass --skip-missing to import the rest")

            def load(idx: int = idx, path: Path = path) -> tuple[torch.Tensor, ...]:
                row = data[idx]
                input_ids = row["input_ids"].reshape(-1).to(torch.int64)
                t = int(input_ids.shape[0])
                try:
                    with safe_open(str(path), framework="pt") as f:
                        keys = set(f.keys())
                        if not {"hidden_states", "token_ids"} <= keys:
                            raise ImportError_(f"{path}: needs tensors hidden_states and token_ids, has {sorted(keys)}")
                        hs = f.get_tensor("hidden_states")
                        token_ids = f.get_tensor("token_ids")
                except SafetensorError as exc:
                    raise ImportError_(f"{path}: not a readable safetensors file ({exc}); truncated?") from None
                if hs.dim() != 3 or hs.shape[1] < 2:
                    raise ImportError_(f"{path}: hidden_states has shape {tuple(hs.shape)}, expected [T, K+1, H] with K >= 1")
                if int(hs.shape[0]) != t or token_ids.reshape(-1).shape[0] != t:
                    raise ImportError_(
                        f"{path}: hidden_states has {hs.shape[0]} tokens, token_ids {token_ids.numel()}, Arrow row {idx} input_ids {t}"
                    )
                if not torch.equal(token_ids.reshape(-1).to(torch.int64), input_ids):
                    bad = int((token_ids.reshape(-1).to(torch.int64) != input_ids).nonzero()[0])
                    raise ImportError_(f"{path}: token_ids differ from Arrow row {idx}'s input_ids (first at token {bad}); the states belong to another prompt")
                mask = _check_mask(row["loss_mask"], t, f"{src} row {idx}")
                return input_ids, mask, hs[:, :-1], hs[:, -1]

            yield sid, str(path), load

    return _run("speculators", src, dest, settings, items(), report, storage=storage, shard_bytes=shard_bytes)


# ---------------------------------------------------------------------------- specforge
_DATA_RE = re.compile(r"^data_(\d+)\.ckpt(\.gz)?$")


def _specforge_files(src: Path) -> list[tuple[int | None, Path]]:
    files = [
        p
        for p in src.rglob("*")
        if p.is_file() and (p.name.endswith(".ckpt") or p.name.endswith(".ckpt.gz")) and not is_temp_name(p.name)
    ]
    for p in files:  # a link among the files could lead the import outside the source
        resolve_member(src, p.relative_to(src).as_posix(), what="SpecForge file", where=str(src))
    indexed = [(int(m.group(1)) if (m := _DATA_RE.match(p.name)) else None, p) for p in files]
    if indexed and all(i is not None for i, _ in indexed):
        seen: dict[int, Path] = {}
        for i, p in indexed:
            if i in seen:
                raise ImportError_(f"{p} and {seen[i]}: two files for sample index {i}")
            seen[i] = p  # type: ignore[index]
        return sorted(indexed, key=lambda x: x[0])  # type: ignore[arg-type, return-value]
    return sorted(indexed, key=lambda x: str(x[1]))


def _torch_load(path: Path) -> Any:
    """``torch.load`` of a plain or gzipped ckpt, memory-mapped; a .gz is expanded with a cap (bounded_gzip)."""
    if not path.name.endswith(".gz"):
        return torch.load(path, weights_only=True, mmap=True, map_location="cpu")
    with gunzip_to_temp(path) as plain:  # the mapping outlives the (unlinked) temporary file
        return torch.load(plain.name, weights_only=True, mmap=True, map_location="cpu")


def _load_ckpt(path: Path) -> dict[str, Any]:
    try:
        raw = _torch_load(path)
    except CompressedInputError as exc:
        raise ImportError_(str(exc)) from None
    except Exception as exc:  # truncated zip, or a pickle weights_only refuses
        raise ImportError_(f"{path}: cannot be read with torch.load(weights_only=True) ({type(exc).__name__}: {exc})") from None
    if not isinstance(raw, dict):
        raise ImportError_(f"{path}: holds a {type(raw).__name__}, expected a dict of tensors")
    return raw


def import_specforge(
    src: str | os.PathLike,
    dest: str | os.PathLike,
    *,
    config: str,
    aux_layer_ids: Sequence[int] | None = None,
    num_hidden_layers: int | None = None,
    model_path: str | None = None,
    model_id: str | None = None,
    storage: str = "native",
    shard_bytes: int | None = None,
    overwrite: bool = False,
) -> ImportReport:
    """Import SpecForge 0.2.0 offline data (``rows_*/data_{idx}.ckpt``); the final state is stored as post_norm."""
    src, dest = Path(src), Path(dest)
    if not src.is_dir():
        raise ImportError_(f"{src}: not a directory")
    settings = _settings(src, "specforge", config=config, aux_layer_ids=aux_layer_ids, num_hidden_layers=num_hidden_layers, model_path=model_path, model_id=model_id)
    files = _specforge_files(src)
    if not files:
        raise ImportError_(f"{src}: no *.ckpt / *.ckpt.gz files (SpecForge offline data) found")
    _prepare_dest(src, dest, overwrite)
    report = ImportReport("specforge", str(src), str(dest))
    hidden_hint: list[int] = []

    def items() -> Iterator[tuple[str, str, Callable[[], Any]]]:
        for pos, (idx, path) in enumerate(files):
            number = idx if idx is not None else pos
            # The sample id lives inside the file (our exports) or derives from the index; peek cheaply for ours.
            sid = f"specforge-{number:08d}"
            raw_holder: dict[str, Any] = {}
            if (src / "hs_dataset_export.json").exists():
                raw_holder["raw"] = _load_ckpt(path)
                stored = raw_holder["raw"].get("sample_id")
                if isinstance(stored, str) and stored:
                    sid = stored

            def load(path: Path = path, raw_holder: dict[str, Any] = raw_holder) -> tuple[torch.Tensor, ...]:
                raw = raw_holder.pop("raw", None) or _load_ckpt(path)
                needed = ("input_ids", "loss_mask", "aux_hidden_state", "hidden_state")
                missing = [k for k in needed if not isinstance(raw.get(k), torch.Tensor)]
                if missing:
                    raise ImportError_(f"{path}: missing tensor(s) {missing} (SpecForge files hold {list(needed)})")
                ids = raw["input_ids"]
                ids = ids.reshape(-1) if ids.dim() == 2 and ids.shape[0] == 1 else ids
                if ids.dim() != 1 or ids.numel() == 0:
                    raise ImportError_(f"{path}: input_ids has shape {tuple(raw['input_ids'].shape)}, expected [T]")
                t = int(ids.shape[0])
                aux, final = raw["aux_hidden_state"], raw["hidden_state"]
                aux = aux[0] if aux.dim() == 3 and aux.shape[0] == 1 else aux
                final = final[0] if final.dim() == 3 and final.shape[0] == 1 else final
                if final.dim() != 2 or int(final.shape[0]) != t:
                    raise ImportError_(f"{path}: hidden_state has shape {tuple(raw['hidden_state'].shape)}, expected [1, {t}, H]")
                hidden = int(final.shape[1])
                if aux.dim() != 2 or int(aux.shape[0]) != t or aux.shape[1] % hidden or aux.shape[1] == 0:
                    raise ImportError_(
                        f"{path}: aux_hidden_state has shape {tuple(raw['aux_hidden_state'].shape)}, expected [1, {t}, K*{hidden}]"
                    )
                if aux.dtype != final.dtype:
                    raise ImportError_(f"{path}: aux_hidden_state is {aux.dtype} but hidden_state is {final.dtype}")
                if hidden_hint and hidden_hint[0] != hidden:
                    raise ImportError_(f"{path}: hidden size {hidden}, the first file's is {hidden_hint[0]}")
                hidden_hint[:] = [hidden]
                mask = _check_mask(raw["loss_mask"], t, str(path))
                k = int(aux.shape[1]) // hidden
                return ids.to(torch.int64), mask, aux.reshape(t, k, hidden), final

            yield sid, str(path), load

    return _run("specforge", src, dest, settings, items(), report, storage=storage, shard_bytes=shard_bytes)

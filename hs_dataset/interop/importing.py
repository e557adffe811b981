"""The machinery both imports share: their settings, what the data means, and the loop into a ShardWriter.

The trainers' own layouts are read by :mod:`hs_dataset.interop.speculators.import_` and
:mod:`hs_dataset.interop.specforge.import_`; each yields its samples to :func:`run_import`.

Neither layout records what its states mean, so an import states it:

* speculators 0.9.0 (``hidden_states/hs_{idx}.safetensors`` + Arrow dataset): the last
  of ``hidden_states``' layers is the final state BEFORE the norm -> stored
  ``final_state: "pre_norm"``; the others are aux layers, HF ``hidden_states`` indexes
  (speculators uses the same convention; default ``[2, L//2, L-3]``).
* SpecForge 0.2.0 (``rows_*/data_{idx}.ckpt``): ``hidden_state`` is AFTER the final norm
  -> stored ``final_state: "post_norm"`` (a different dataset identity than a pre-norm
  capture, on purpose); ``aux_hidden_state`` is K aux layers concatenated, HF ids = the
  SGLang capture ids + 1 (default ``[2, L//2, L-3]``).

Where the layer ids come from, first match wins: :attr:`~hs_dataset.interop.settings.ImportSettings.aux_layer_ids`; the
``hs_dataset_export.json`` record if the directory is one of our exports; the config
card named by ``config`` (if it is a card); speculators'/SpecForge's default from
``num_hidden_layers`` (:func:`~hs_dataset.interop.common.trainer_default_aux_layer_ids`).
Contradictions between these, or with the files, are refused. The ids are the manifest's
claim (``formats/claims.py``), checked before anything is written: below the model's depth
(``num_hidden_layers``, ``--model-path``'s config, the export record), else below
:data:`~hs_dataset.formats.claims.MAX_NUM_HIDDEN_LAYERS`.

Inconsistent files are refused by name (:class:`ImportDataError`): missing keys, shape
mismatches between tensors or with the first file, token_ids != input_ids, mixed dtypes.

Every sample's token count is checked against a bound from its DECLARED shapes, before
any state is read or copied (:func:`check_declared_tokens`): ``--max-length``, else the
card's ``max_length``, else the model's ``max_position_embeddings`` (``--model-path``),
else :data:`DEFAULT_MAX_TOKENS`. A sample id met twice in one import is refused naming
both files when the two differ, and stored once (with the second file named in the
report) when they are equal (:func:`run_import`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from hs_dataset.dtypes import state_dtype_name
from hs_dataset.errors import HsDatasetError
from hs_dataset.formats.claims import aux_layer_ids_problem
from hs_dataset.formats.metadata import HF_HIDDEN_STATES_INDEX, BackendRecord, DatasetMetadata, FinalNorm, ModelRecord
from hs_dataset.formats.vocabulary import check_token_ids
from hs_dataset.interop.common import (
    clear_own_export,
    paths_overlap,
    read_export_record,
    refuse_symlinked_destination,
    trainer_default_aux_layer_ids,
)
from hs_dataset.interop.settings import ImportSettings
from hs_dataset.progress.task import task
from hs_dataset.sample import sample_id_problem

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "ImportDataError",
    "ImportReport",
    "ResolvedImport",
    "SampleItem",
    "check_declared_tokens",
    "check_file_sample_id",
    "check_mask",
    "prepare_import_dest",
    "resolve_settings",
    "run_import",
]


# The bound when neither --max-length, a card nor --model-path gives one: longer than any
# context current models train drafters on, small enough that one sample's states fit memory.
DEFAULT_MAX_TOKENS = 131_072

_IDS_FIX = "the file is not this model's data: fix or remove it (--model-path gives the model's vocabulary)"


class ImportDataError(HsDatasetError, ValueError):
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
    duplicates: list[dict[str, str]] = field(default_factory=list)  # {sample_id, file, same_as}: equal content, stored once
    metadata: DatasetMetadata = field(default_factory=lambda: DatasetMetadata(json_keys=()))

    def to_json(self) -> dict[str, Any]:
        return {**asdict(replace(self, metadata=DatasetMetadata(json_keys=()))), "metadata": self.metadata.to_json()}

    def summary(self) -> str:
        md = self.metadata
        ids = None if md.aux_layer_ids is None else list(md.aux_layer_ids)
        lines = [
            f"imported {self.source_format} data {self.source} -> {self.dest}",
            f"  samples written   {self.samples_written} ({self.tokens_written} tokens); already stored {self.skipped_existing}",
            f"  aux layers        {ids} (HF hidden_states indexes); final state {md.final_state}",
            f"  dtype / hidden    {md.dtype} / {md.hidden_size}",
        ]
        if self.skipped_missing:
            lines.append(f"  missing files skipped: {len(self.skipped_missing)} (e.g. {self.skipped_missing[:3]})")
        if self.duplicates:
            d = self.duplicates[0]
            lines.append(
                f"  duplicate files (same sample id, same content; stored once): {len(self.duplicates)} "
                f"(e.g. {d['file']} = {d['same_as']}, id {d['sample_id']!r})"
            )
        for q in self.quarantined[:10]:
            lines.append(f"  quarantined {q['sample_id']}: {q['reason']}")
        return "\n".join(lines)


@dataclass
class ResolvedImport:
    """What the settings, the export record and the card resolve to."""

    config_name: str
    config_fingerprint: str
    model: dict[str, Any]
    aux_layer_ids: list[int] | None
    num_hidden_layers: int | None
    norm_weight: torch.Tensor | None
    norm_eps: float | None
    card_dtype: str | None
    vocab_size: int | None = None  # the model's (--model-path); None: ids are bounded by formats.vocabulary.MAX_VOCAB_SIZE
    max_tokens: int = DEFAULT_MAX_TOKENS  # the longest sample accepted, checked on declared shapes
    max_tokens_source: str = "the import's default bound"  # where max_tokens comes from, for the refusal's message


# ---------------------------------------------------------------------------- settings
def _load_card_or_none(config: str) -> Any:
    from hs_dataset.config import CardError, load_card

    looks_like_path = Path(config).suffix in (".yaml", ".yml")
    try:
        return load_card(config)
    except CardError as exc:
        if looks_like_path or "unknown config" not in str(exc):
            raise ImportDataError(str(exc)) from None
        return None


def _record_of(src: Path, fmt: str) -> dict[str, Any] | None:
    record = read_export_record(src)
    return record if record and record.get("target") == fmt else None


def resolve_settings(src: Path, fmt: str, settings: ImportSettings) -> ResolvedImport:
    """Layer ids, model, norm and names for the import of ``src``; contradictions are refused by name."""
    card = _load_card_or_none(settings.config)
    record = _record_of(src, fmt) or {}
    layers = record.get("layers") or {}
    sources = _layer_id_sources(src, settings.aux_layer_ids, layers, card)
    model, norm_weight, norm_eps, num_hidden_layers = _model_and_norm(settings, card, record)
    recorded_layers = layers.get("num_hidden_layers")
    if num_hidden_layers is not None and recorded_layers is not None and int(recorded_layers) != int(num_hidden_layers):
        raise ImportDataError(f"num_hidden_layers {num_hidden_layers} contradicts {src}/hs_dataset_export.json ({recorded_layers})")
    num_hidden_layers = num_hidden_layers if num_hidden_layers is not None else recorded_layers
    if norm_weight is None and fmt == "speculators":
        norm = record.get("final_norm")
        if isinstance(norm, dict) and "weight_file" in norm:
            norm_weight, norm_eps = _recorded_norm(src, norm)
    if not sources and card is not None and card.layers.aux is None and num_hidden_layers:  # the card's preset, for the model's layers
        sources.append((f"config {card.name}", card.aux_layers_for(int(num_hidden_layers))))
    ids = sources[0][1] if sources else (trainer_default_aux_layer_ids(int(num_hidden_layers)) if num_hidden_layers else None)
    if card is not None:
        fingerprint = card.fingerprint
        name = card.name
    else:
        name = settings.config
        fingerprint = hashlib.sha256(json.dumps({"import": fmt, "config": settings.config}, sort_keys=True).encode()).hexdigest()
    return ResolvedImport(
        config_name=name,
        config_fingerprint=fingerprint,
        model=model,
        aux_layer_ids=ids,
        num_hidden_layers=int(num_hidden_layers) if num_hidden_layers is not None else None,
        norm_weight=norm_weight,
        norm_eps=norm_eps,
        card_dtype=card.dtype if card is not None else None,
        vocab_size=_model_vocab_size(settings.model_path),
        **_token_bound(settings, card),
    )


def _token_bound(settings: ImportSettings, card: Any) -> dict[str, Any]:
    """``max_tokens`` and where it comes from: --max-length, the card, the model's context, or the default."""
    if settings.max_length is not None:
        return {"max_tokens": int(settings.max_length), "max_tokens_source": "--max-length"}
    if card is not None:
        return {"max_tokens": int(card.max_length), "max_tokens_source": f"config {card.name} max_length"}
    if settings.model_path is not None:
        from hs_dataset.model.model_config import load_text_config
        from hs_dataset.model.snapshot import resolve_model_path

        context = load_text_config(resolve_model_path(settings.model_path)).get("max_position_embeddings")
        if context is not None:
            return {"max_tokens": int(context), "max_tokens_source": "the model's max_position_embeddings"}
    return {"max_tokens": DEFAULT_MAX_TOKENS, "max_tokens_source": "the import's default bound"}


def check_declared_tokens(tokens: int, resolved: ResolvedImport, *, where: str, tensor: str, shape: Sequence[int]) -> None:
    """Refuse a sample longer than the bound from its declared shape, before its states are read: a file cannot buy memory."""
    if tokens > resolved.max_tokens:
        raise ImportDataError(
            f"{where}: tensor {tensor} declares shape {list(shape)}: {tokens} tokens, over max_length {resolved.max_tokens} "
            f"({resolved.max_tokens_source}); pass --max-length N to import longer samples, or remove the file"
        )


def _model_vocab_size(model_path: Any) -> int | None:
    """The vocabulary size of the model ``--model-path`` names (every imported id must lie below it), or None."""
    if model_path is None:
        return None
    from hs_dataset.model.model_config import load_text_config
    from hs_dataset.model.snapshot import resolve_model_path

    size = load_text_config(resolve_model_path(model_path)).get("vocab_size")
    return int(size) if size is not None else None


def _layer_id_sources(src: Path, aux_layer_ids: Sequence[int] | None, layers: dict[str, Any], card: Any) -> list[tuple[str, list[int]]]:
    """(where, ids) of every statement of the layer ids, first wins; the settings and the export record must agree."""
    sources: list[tuple[str, list[int]]] = []
    if aux_layer_ids is not None:
        sources.append(("--aux-layer-ids", [int(i) for i in aux_layer_ids]))
    recorded_ids = layers.get("target_layer_ids", layers.get("aux_layer_ids_hf"))  # [] is a record: the final state only
    if recorded_ids is not None:
        sources.append((f"{src}/hs_dataset_export.json", [int(i) for i in recorded_ids]))
    if card is not None and card.layers.aux is not None:
        sources.append((f"config {card.name}", list(card.layers.aux)))
    # The explicit value and the export record describe the files; they must agree.
    hard = [s for s in sources if not s[0].startswith("config ")]
    if len({tuple(ids) for _, ids in hard}) > 1:
        raise ImportDataError("layer ids disagree: " + "; ".join(f"{where} says {ids}" for where, ids in hard))
    return sources


def _model_and_norm(
    settings: ImportSettings, card: Any, record: dict[str, Any]
) -> tuple[dict[str, Any], torch.Tensor | None, float | None, int | None]:
    """(model record, final-norm weight and eps, num_hidden_layers) from the settings, the card and the export record."""
    model_path, model_id, num_hidden_layers = settings.model_path, settings.model_id, settings.num_hidden_layers
    norm_weight = norm_eps = None
    model: dict[str, Any] = {"path": None, "id": model_id, "revision": None, "fingerprint": None}
    if card is not None:
        model.update(path=card.model.path, id=model_id or card.model.id, revision=card.model.revision)
    source_model = (record.get("source") or {}).get("model")
    if isinstance(source_model, dict) and model_path is None:
        model.update({k: source_model.get(k) for k in ("path", "id", "revision", "fingerprint")})
    if model_path is not None:
        from hs_dataset.model.model_config import load_text_config
        from hs_dataset.model.snapshot import model_fingerprint, read_final_norm, resolve_model_path

        local = resolve_model_path(model_path)
        model.update(path=str(local), fingerprint=model_fingerprint(local))
        weight, eps = read_final_norm(local)
        norm_weight, norm_eps = weight, float(eps)  # type: ignore[assignment]
        model_layers = load_text_config(local).get("num_hidden_layers")
        if num_hidden_layers is not None and model_layers is not None and int(model_layers) != int(num_hidden_layers):
            raise ImportDataError(f"--num-hidden-layers {num_hidden_layers} contradicts {local}/config.json ({model_layers})")
        num_hidden_layers = num_hidden_layers or model_layers
    return model, norm_weight, norm_eps, num_hidden_layers


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
        raise ImportDataError(f"{where}: final_norm.eps must be a small non-negative number, got {str(eps)[:40]}")
    return weight, float(eps)


_IMPORT_KEYS = (
    "config_name",
    "config_fingerprint",
    "model",
    "aux_layer_ids",
    "layer_convention",
    "final_state",
    "dtype",
    "hidden_size",
    "num_hidden_layers",
    "backend",
)


def _check_aux_layer_ids(ids: list[int], num_hidden_layers: int | None) -> None:
    """The manifest's claim (``formats/claims.py``), refused before anything is written: ids below the model's depth
    (given, from ``--model-path``'s config or the export record), else below the deepest a model config may describe."""
    problem = aux_layer_ids_problem(ids, num_hidden_layers)
    if problem is None:
        return
    depth = "" if num_hidden_layers is not None else ", or give the model's depth with --num-hidden-layers L or --model-path DIR"
    raise ImportDataError(f"aux layer ids {problem}; pass --aux-layer-ids as HF hidden_states indexes of the model{depth}")


def _metadata(resolved: ResolvedImport, fmt: str, src: Path, *, k: int, hidden: int, dtype: torch.dtype, where: str) -> DatasetMetadata:
    ids = resolved.aux_layer_ids
    if ids is None:
        raise ImportDataError(
            f"{where}: {k} aux layers, but nothing says which: pass --aux-layer-ids (HF hidden_states indexes) or "
            "--num-hidden-layers L for the trainer's default [2, L//2, L-3], or name a config card that lists them"
        )
    if len(ids) != k:
        raise ImportDataError(f"{where}: the files hold {k} aux layers but the layer ids are {ids} ({len(ids)} layers)")
    _check_aux_layer_ids(ids, resolved.num_hidden_layers)
    try:
        dtype_name = state_dtype_name(dtype)
    except ValueError:
        raise ImportDataError(f"{where}: states are {dtype}; only bfloat16, float16 and float32 can be stored") from None
    if resolved.card_dtype is not None and resolved.card_dtype != dtype_name:
        raise ImportDataError(
            f"{where}: states are {dtype_name} but config {resolved.config_name!r} captures {resolved.card_dtype}; "
            "name another config (or a free-form name with --aux-layer-ids)"
        )
    if resolved.norm_weight is not None and tuple(resolved.norm_weight.shape) != (hidden,):
        raise ImportDataError(f"the final-norm weight has shape {tuple(resolved.norm_weight.shape)}, the data's hidden size is {hidden}")
    source_format = {"speculators": "speculators 0.9.0", "specforge": "specforge 0.2.0"}[fmt]
    return DatasetMetadata(
        config_name=resolved.config_name,
        config_fingerprint=resolved.config_fingerprint,
        model=ModelRecord(**resolved.model),
        aux_layer_ids=tuple(ids),
        layer_convention=HF_HIDDEN_STATES_INDEX,
        final_state="pre_norm" if fmt == "speculators" else "post_norm",
        dtype=dtype_name,
        hidden_size=hidden,
        num_hidden_layers=resolved.num_hidden_layers,
        backend=BackendRecord(name="import", extra={"format": source_format, "source": str(src)}),
        final_norm=None if resolved.norm_eps is None else FinalNorm(kind="rmsnorm", eps=resolved.norm_eps),
        json_keys=_IMPORT_KEYS,  # no tokenizer, card limits or capture checks: an import records what it knows
    )


def prepare_import_dest(src: Path, dest: Path, overwrite: bool) -> None:
    """Refuse a destination overlapping the source or that is a link; ``overwrite`` deletes an earlier export there, nothing else."""
    if paths_overlap(src, dest):
        raise ImportDataError(f"destination {dest} overlaps the source {src}; import into a separate directory")
    refuse_symlinked_destination(dest)
    if overwrite and dest.is_dir() and any(dest.iterdir()):
        clear_own_export(dest, f"{dest} is not empty")


# ---------------------------------------------------------------------------- the shared loop
# (sample id, file name, loader -> (input_ids, loss_mask, aux [T, K, H], final [T, H]))
SampleLoader = Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
SampleItem = tuple[str, str, SampleLoader]


def _same_sample(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> bool:
    """Whether two loaded samples are one: every tensor equal in shape, dtype and values."""
    return all(x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _check_duplicate(sid: str, where: str, load: SampleLoader, first: tuple[str, SampleLoader], report: ImportReport) -> None:
    """A sample id met a second time in this import: a different sample is a conflict, the same one is stored once.

    Dropping the second file silently (it looks "already stored") would lose a sample
    without a word; storing both is impossible (one id, one sample). Equal content (a
    file copied twice) is harmless: stored once, and the report names the copy.
    """
    first_where, first_load = first
    if not _same_sample(first_load(), load()):
        raise ImportDataError(
            f"sample id {sid!r} is in two files with different content: {first_where} and {where}; "
            "give one of them another sample_id, or remove the wrong file"
        )
    report.duplicates.append({"sample_id": sid, "file": where, "same_as": first_where})


def run_import(
    fmt: str,
    src: Path,
    dest: Path,
    resolved: ResolvedImport,
    items: Iterator[SampleItem],
    report: ImportReport,
    settings: ImportSettings,
    total: int | None = None,
) -> ImportReport:
    """Write every sample ``items`` yields into ``dest``; samples already stored there are skipped (a resumed import).

    ``total``: the samples ``items`` will yield, for the progress line's ETA (None: unknown).
    """
    from hs_dataset.formats.writer import ShardWriter
    from hs_dataset.sample import CapturedSample

    writer = None
    shape: tuple[int, int, torch.dtype] | None = None
    seen: dict[str, tuple[str, SampleLoader]] = {}  # this run's ids: a second file with one is a duplicate, not "already stored"
    shown = task("import", "samples", total, sizes=lambda: writer.progress_bytes() if writer is not None else (0, 0))
    try:
        for sid, where, load in items:
            if sid in seen:
                _check_duplicate(sid, where, load, seen[sid], report)
                shown.advance(fresh=False)
                continue
            seen[sid] = (where, load)
            if writer is not None and writer.contains(sid):
                report.skipped_existing += 1
                shown.advance(fresh=False)
                continue
            ids, mask, aux, final = load()
            check_token_ids(ids, resolved.vocab_size, where=where, sample=sid, fix=_IDS_FIX)
            report.files_read += 1
            if shape is None:
                shape = (int(aux.shape[1]), int(aux.shape[2]), aux.dtype)
                md = _metadata(resolved, fmt, src, k=shape[0], hidden=shape[1], dtype=shape[2], where=where)
                report.metadata = md
                kwargs: dict[str, Any] = {"final_norm_weight": resolved.norm_weight, "storage": settings.storage}
                if settings.shard_bytes is not None:
                    kwargs["shard_bytes"] = settings.shard_bytes
                writer = ShardWriter(dest, md, **kwargs)
                if writer.contains(sid):
                    report.skipped_existing += 1
                    shown.advance(fresh=False)
                    continue
            elif (int(aux.shape[1]), int(aux.shape[2]), aux.dtype) != shape:
                raise ImportDataError(
                    f"{where}: aux states are [T, {aux.shape[1]}, {aux.shape[2]}] {aux.dtype}, the first file's are "
                    f"[T, {shape[0]}, {shape[1]}] {shape[2]} (mixed layouts in one directory)"
                )
            sample = CapturedSample(sid, ids.to(torch.int64), mask.to(torch.bool), aux.contiguous(), final.contiguous())
            if writer.add(sample):  # type: ignore[union-attr]
                report.tokens_written += int(ids.shape[0])
            shown.advance(tokens=int(ids.shape[0]))
        if writer is not None:
            wr = writer.close()
            report.samples_written = wr.written
            report.quarantined = list(wr.quarantined)
            report.tokens_written = wr.tokens
        shown.close()
    except BaseException:
        shown.close(ok=False)
        if writer is not None:
            writer.abort()
        raise
    if writer is None and not report.skipped_missing:
        raise ImportDataError(f"{src}: no {fmt} sample files found")
    return report


def check_file_sample_id(sid: object, where: str) -> str:
    """A sample id a file states (an export's ``sample_id``, an Arrow ``sample_id`` column), refused naming ``where``
    when the writer could not store it (``sample.sample_id_problem``): None, a number, empty, or over the length bound."""
    problem = sample_id_problem(sid)
    if problem is not None:
        raise ImportDataError(f"{where}: {problem}; fix the file's sample_id or remove the file")
    return sid  # type: ignore[return-value]


def check_mask(mask: torch.Tensor, t: int, where: str) -> torch.Tensor:
    mask = mask.reshape(-1) if mask.dim() == 2 and mask.shape[0] == 1 else mask
    if mask.dim() != 1 or int(mask.shape[0]) != t:
        raise ImportDataError(f"{where}: loss_mask has shape {tuple(mask.shape)}, input_ids has {t} tokens")
    if mask.dtype != torch.bool and bool(((mask != 0) & (mask != 1)).any()):
        raise ImportDataError(f"{where}: loss_mask holds values other than 0/1")
    return mask

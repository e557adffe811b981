"""The product's spine: source rows -> tokens + loss mask -> capture backend -> shard writer.

``build_dataset`` is what the CLI, the ``datasets`` builder and the tests call. It is
resumable: the writer knows which sample ids are stored, so a rerun after a crash
only captures what is missing. For the in-process backend, batches are fixed
windows of the source order, and a batch is re-captured whole whenever any member is
missing, so a resumed build stores the same bytes as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from hs_dataset.capture.base import CaptureBackend, CaptureFailure, CaptureInfo
from hs_dataset.config import Card, HFBackendSection
from hs_dataset.dtypes import state_dtype_name
from hs_dataset.errors import UsageError
from hs_dataset.faults import crash_point
from hs_dataset.formats.atomic import atomic_write_bytes
from hs_dataset.formats.writer import ShardWriter, WriterReport
from hs_dataset.sample import TokenizedSample

__all__ = ["RunReport", "build_dataset", "dataset_metadata", "make_backend", "RUN_REPORT_NAME", "partition"]

RUN_REPORT_NAME = "run_report.json"


@dataclass
class RunReport:
    """What a build did: every input row is accounted for somewhere in here."""

    config: str
    out_dir: str
    samples_considered: int = 0
    samples_written: int = 0
    skipped_existing: int = 0
    tokens_written: int = 0
    bytes_written: int = 0
    truncated: int = 0
    capture_failures: list[dict[str, str]] = field(default_factory=list)
    quarantined: list[dict[str, str]] = field(default_factory=list)
    rejected_shards: list[str] = field(default_factory=list)
    source: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0
    rank: int = 0
    world_size: int = 1

    @property
    def samples_per_s(self) -> float:
        return self.samples_written / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_written / self.elapsed_s if self.elapsed_s else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "samples_per_s": round(self.samples_per_s, 3), "tokens_per_s": round(self.tokens_per_s, 1)}

    def summary(self) -> str:
        src = self.source
        dropped = src.get("issues", [])
        reasons: dict[str, int] = {}
        for issue in dropped:
            reasons[issue["kind"]] = reasons.get(issue["kind"], 0) + 1
        for failure in self.capture_failures:
            reasons["capture_failed"] = reasons.get("capture_failed", 0) + 1
        for _q in self.quarantined:
            reasons["quarantined_nonfinite"] = reasons.get("quarantined_nonfinite", 0) + 1
        lines = [
            f"run report for {self.config} -> {self.out_dir}",
            f"  rows read            {src.get('rows_read', 0)}",
            f"  samples written      {self.samples_written} ({self.tokens_written} tokens, {self.bytes_written / 2**20:.1f} MiB)",
            f"  already stored       {self.skipped_existing}",
            f"  truncated            {self.truncated}",
            f"  not written          {sum(reasons.values())}" + (f" ({', '.join(f'{k}: {v}' for k, v in sorted(reasons.items()))})" if reasons else ""),
            f"  time                 {self.elapsed_s:.1f} s ({self.samples_per_s:.2f} samples/s, {self.tokens_per_s:.0f} tokens/s)",
        ]
        for issue in dropped[:10]:
            lines.append(f"    row {issue['row_index']}: {issue['kind']}: {issue['reason']}")
        for failure in self.capture_failures[:10]:
            lines.append(f"    {failure['sample_id']}: capture failed: {failure['reason']}")
        for q in self.quarantined[:10]:
            lines.append(f"    {q['sample_id']}: quarantined: {q['reason']}")
        for name in self.rejected_shards:
            lines.append(f"    {name}: unlisted shard of another dataset, renamed to {name}.rejected")
        return "\n".join(lines)


# ---------------------------------------------------------------------------- set-up
def make_backend(card: Card, *, model_path: str | None = None, device: str | None = None, servers: list[str] | None = None, **extra: Any) -> CaptureBackend:
    """Instantiate the backend a card names (``hf`` in-process, ``sglang`` client)."""
    backend = card.backend
    path = model_path or card.model.path or os.environ.get("HS_DATASET_MODEL_PATH")
    if not path:
        raise UsageError(f"config {card.name!r} needs a local model directory: pass --model-path DIR (hs_dataset never downloads weights)")
    if isinstance(backend, HFBackendSection):
        from hs_dataset.capture.hf import HFBackend

        return HFBackend(
            path,
            card.layers.aux,
            dtype=card.dtype,
            device=device or backend.device,
            text_module=card.model.text_module,
            model_revision=card.model.revision,
        )
    from hs_dataset.capture.sglang.client import SGLangBackend

    return SGLangBackend.from_card(card, model_path=path, servers=servers, **extra)


def _tokenizer_info(tokenizer: Any, path: Path) -> dict[str, Any]:
    template = getattr(tokenizer, "chat_template", None) or ""
    tok_file = path / "tokenizer.json"
    return {
        "path": str(path),
        "class": type(tokenizer).__name__,
        "vocab_size": len(tokenizer),
        "fingerprint": hashlib.sha256(tok_file.read_bytes()).hexdigest() if tok_file.exists() else None,
        "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest() if template else None,
    }


def dataset_metadata(card: Card, info: CaptureInfo, tokenizer_info: dict[str, Any]) -> dict[str, Any]:
    """The manifest metadata: what every stored tensor means, and where it came from."""
    return {
        "config_name": card.name,
        "config_fingerprint": card.fingerprint,
        "model": {
            "path": info.model_path,
            "id": card.model.id,
            "revision": info.model_revision,
            "fingerprint": info.model_fingerprint,
        },
        "aux_layer_ids": list(info.aux_layer_ids),
        "layer_convention": "hf_hidden_states_index",
        "final_state": info.final_state,
        "final_norm": {"kind": "rmsnorm", "eps": info.final_norm_eps},
        "dtype": state_dtype_name(info.dtype),
        "hidden_size": info.hidden_size,
        "num_hidden_layers": info.num_hidden_layers,
        "vocab_size": info.vocab_size,
        "tokenizer": tokenizer_info,
        "max_length": card.max_length,
        "overflow": card.overflow,
        "backend": {"name": info.backend, **info.backend_details},
    }


def partition(samples: Iterable[TokenizedSample], rank: int, world_size: int) -> Iterator[TokenizedSample]:
    """Deterministic split of the source order across ranks: sample k goes to rank k % world_size."""
    for k, sample in enumerate(samples):
        if k % world_size == rank:
            yield sample


def _limit(samples: Iterable[TokenizedSample], n: int | None) -> Iterator[TokenizedSample]:
    for k, sample in enumerate(samples):
        if n is not None and k >= n:
            return
        yield sample


def _batches(samples: Iterable[TokenizedSample], size: int) -> Iterator[list[TokenizedSample]]:
    batch: list[TokenizedSample] = []
    for sample in samples:
        batch.append(sample)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _resolve_source(card: Card, source: Any) -> Any:
    if source is not None:
        return source
    path = card.source.path
    if path == "builtin:conversations":
        from hs_dataset.sources import bundled_conversations_path

        return bundled_conversations_path()
    if not path:
        raise UsageError(f"config {card.name!r} names no source data: pass --source PATH (JSONL or a saved datasets directory)")
    return path


# ---------------------------------------------------------------------------- the build
def build_dataset(
    card: Card,
    out_dir: str | os.PathLike,
    *,
    num_samples: int | None = None,
    source: Any = None,
    batch_size: int | None = None,
    backend: CaptureBackend | None = None,
    model_path: str | None = None,
    device: str | None = None,
    servers: list[str] | None = None,
    shard_bytes: int | None = None,
    storage: str | None = None,
    rank: int = 0,
    world_size: int = 1,
    strict: bool = False,
    progress: bool = False,
    writer_threads: int = 2,
) -> RunReport:
    """Capture ``card``'s data into ``out_dir`` (created or resumed). Returns the run report."""
    from transformers import AutoTokenizer

    from hs_dataset.sources import SourceReport, iter_samples

    if not 0 <= rank < world_size:
        raise UsageError(f"rank must be in [0, world_size), got rank={rank} world_size={world_size}")
    started = time.perf_counter()
    out_dir = Path(out_dir)
    own_backend = backend is None
    backend = backend or make_backend(card, model_path=model_path, device=device, servers=servers)
    try:
        info = backend.info()
        tokenizer_dir = Path(info.model_path)
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
        metadata = dataset_metadata(card, info, _tokenizer_info(tokenizer, tokenizer_dir))
        report = RunReport(config=card.name, out_dir=str(out_dir), rank=rank, world_size=world_size)
        source_report = SourceReport()
        resolved_source = _resolve_source(card, source)
        samples = iter_samples(
            resolved_source, tokenizer, max_length=card.max_length, overflow=card.overflow,
            strict=strict, report=source_report, vocab_size=info.vocab_size,
        )
        samples = partition(_limit(samples, num_samples), rank, world_size)
        batch_size = batch_size or card.backend.batch_size
        with ShardWriter(
            out_dir,
            metadata,
            final_norm_weight=info.final_norm_weight,
            storage=storage or card.shards.storage,
            shard_bytes=shard_bytes or card.shards.bytes,
            shard_prefix=f"rank{rank:05d}-" if world_size > 1 else "",
            writer_threads=writer_threads,
        ) as writer:
            bar = _progress(_expected_samples(resolved_source, num_samples, rank, world_size)) if progress else None
            for result in _capture(backend, samples, batch_size, writer, report):
                if isinstance(result, CaptureFailure):
                    report.capture_failures.append({"sample_id": result.sample_id, "reason": result.reason})
                elif writer.add(result):
                    report.tokens_written += result.num_tokens
                if bar is not None:
                    bar.update(1)
                    _update_postfix(bar, writer, report, started)
            if bar is not None:
                bar.close()
        wrep: WriterReport = writer.report
        report.samples_written = wrep.written
        report.bytes_written = wrep.bytes_written
        report.quarantined = list(wrep.quarantined)
        report.rejected_shards = list(wrep.rejected_shards)
        report.truncated = source_report.truncated
        report.source = {
            "name": source_report.source_name,
            "rows_read": source_report.rows_read,
            "samples_out": source_report.samples_out,
            "truncated": source_report.truncated,
            "issues": [asdict(i) for i in source_report.issues],
            "notes": list(source_report.notes),
        }
        report.elapsed_s = time.perf_counter() - started
        _save_report(out_dir, report)
        return report
    finally:
        if own_backend:
            backend.close()


def _capture(backend: CaptureBackend, samples: Iterable[TokenizedSample], batch_size: int, writer: ShardWriter, report: RunReport):
    """Yield capture results for every sample not yet stored.

    Fixed windows of the source order form the batches; a window whose members are
    all stored is skipped without a forward pass.
    """
    if not backend.fixed_batches:
        def missing() -> Iterator[TokenizedSample]:
            for sample in samples:
                report.samples_considered += 1
                if writer.contains(sample.sample_id):
                    report.skipped_existing += 1
                else:
                    yield sample

        yield from backend.capture_stream(missing(), batch_size)
        return
    for batch in _batches(samples, batch_size):
        report.samples_considered += len(batch)
        todo = [s for s in batch if not writer.contains(s.sample_id)]
        report.skipped_existing += len(batch) - len(todo)
        if not todo:
            continue
        wanted = {s.sample_id for s in todo}
        for result in backend.capture_batch(batch):
            if result.sample_id in wanted:
                yield result
        crash_point("pipeline.after_batch")


def _save_report(out_dir: Path, report: RunReport) -> None:
    path = out_dir / RUN_REPORT_NAME
    runs: list[Any] = []
    if path.exists():
        try:
            runs = json.loads(path.read_text()).get("runs", [])
        except (ValueError, AttributeError):
            runs = []
    runs.append(report.to_json())
    atomic_write_bytes(path, json.dumps({"runs": runs}, indent=1).encode())


def _expected_samples(source: Any, num_samples: int | None, rank: int, world_size: int) -> int | None:
    """Rows this rank will see, for the progress bar's total and ETA (None when unknown cheaply)."""
    rows: int | None = None
    if isinstance(source, (str, os.PathLike)) and str(source).endswith(".jsonl") and Path(source).is_file():
        with open(source, "rb") as f:
            rows = sum(1 for line in f if line.strip())
    elif hasattr(source, "__len__"):
        rows = len(source)
    if num_samples is not None:
        rows = num_samples if rows is None else min(rows, num_samples)
    if rows is None:
        return None
    return len(range(rank, rows, world_size))


def _progress(total: int | None):
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="sample", dynamic_ncols=True, desc="capture")


def _update_postfix(bar, writer: ShardWriter, report: RunReport, started: float) -> None:
    elapsed = max(time.perf_counter() - started, 1e-9)
    bar.set_postfix_str(
        f"{report.tokens_written / elapsed:.0f} tok/s, {writer.report.bytes_written / 2**20:.1f} MiB written",
        refresh=False,
    )


"""The product's spine: source rows -> tokens + loss mask -> capture backend -> shard writer.

``build_dataset`` is what the CLI, the ``datasets`` builder and the tests call. It is
resumable: the writer knows which sample ids are stored, so a rerun after a crash
only captures what is missing. For the in-process backend, batches are fixed
windows of the source order, and a batch is re-captured whole whenever any member is
missing, so a resumed build stores the same bytes as an uninterrupted one.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from hs_dataset.capture.base import CaptureBackend, CaptureFailure, CaptureResult
from hs_dataset.config import Card
from hs_dataset.config.run import BuildOptions, parse_options
from hs_dataset.dataset_access import output_dir
from hs_dataset.faults import crash_point
from hs_dataset.formats.build_state import BuildState
from hs_dataset.formats.vocabulary import vocab_size_of
from hs_dataset.formats.writer import ShardWriter
from hs_dataset.pipeline.resume import interrupted_message, running_state
from hs_dataset.pipeline.run_report import RunReport, save_run_report
from hs_dataset.pipeline.session import CaptureSession, as_card
from hs_dataset.progress.settings import ProgressSettings, active
from hs_dataset.progress.task import Task
from hs_dataset.regenerate.engine import Regeneration
from hs_dataset.regenerate.progress import RegenerationProgress
from hs_dataset.sample import TokenizedSample, batches
from hs_dataset.sources.report import SourceReport

__all__ = ["build_dataset"]

READ_AHEAD_WINDOWS = 2  # capture windows tokenized ahead of the backend


def build_dataset(
    card: Card | str | os.PathLike, out_dir: str | os.PathLike, *, backend: CaptureBackend | None = None, **options: Any
) -> RunReport:
    """Capture ``card``'s data into ``out_dir`` (created or resumed). Returns the run report.

    ``out_dir`` may be an fsspec URL (``s3://bucket/prefix``): the build then writes a
    local staging directory and uploads its shards, manifest last (docs/REMOTE.md).

    ``card``: a :class:`Card`, a shipped card name or a ``.yaml`` path. ``options``:
    :class:`~hs_dataset.config.run.BuildOptions` (num_samples, source, batch_size,
    model_path, device, servers, shard_bytes, storage, rank, world_size, strict,
    progress, writer_threads, remote, command); an unknown one is refused by name. ``backend``: an
    already built capture backend; the build then does not close it.

    The manifest records the build as ``running`` (with the samples expected and the
    command that resumes it) until the last shard is listed, then ``finished``
    (:mod:`hs_dataset.formats.build_state`). Ctrl-C (or SIGTERM, where the CLI maps it)
    raises a KeyboardInterrupt whose message says how many samples
    are stored and the command that resumes the build.
    """
    opts = parse_options(BuildOptions, "build_dataset()", options)
    started = time.perf_counter()
    with output_dir(out_dir, opts.remote) as local_dir:
        try:
            return _build_dataset(card, local_dir, out_dir, opts, backend, started)
        except KeyboardInterrupt as exc:  # still a KeyboardInterrupt: ``except Exception`` in a caller must not swallow Ctrl-C
            raise KeyboardInterrupt(interrupted_message(local_dir)) from exc


def _build_dataset(
    card: Card | str | os.PathLike,
    out_dir: Path,
    given_out: str | os.PathLike,
    opts: BuildOptions,
    backend: CaptureBackend | None,
    started: float,
) -> RunReport:
    """``given_out``: the output as the caller named it (a URL where ``out_dir`` is its staging), for the resume command."""
    with CaptureSession(as_card(card), opts, backend=backend) as session:
        regen = _open_regeneration(session, out_dir, opts) if session.card.regenerate.enabled else None
        try:
            report = _build(session, out_dir, given_out, opts, regen, started)
        finally:
            if regen is not None:
                regen.close()
    return report


def _open_regeneration(session: CaptureSession, out_dir: Path, opts: BuildOptions) -> Regeneration:
    name = f"rank{opts.rank:05d}-regenerated.jsonl" if opts.world_size > 1 else "regenerated.jsonl"
    card, backend = session.card, session.backend
    generator = backend.generator(card.regenerate, session.tokenizer)
    burst = backend.capture_burst(card.backend.batch_size)
    vocab_size = vocab_size_of(session.metadata)  # the bound the manifest records, and verify checks: the model's, else the tokenizer's
    return Regeneration(card, generator, session.tokenizer, out_dir, name, burst=burst, vocab_size=vocab_size)


def _build(
    session: CaptureSession, out_dir: Path, given_out: str | os.PathLike, opts: BuildOptions, regen: Regeneration | None, started: float
) -> RunReport:
    """Tokenize, regenerate (when the card asks), capture and write; the report accounts for every row."""
    card = session.card
    report = RunReport(config=card.name, out_dir=str(out_dir), rank=opts.rank, world_size=opts.world_size)
    source_report = SourceReport()
    rows = session.open_rows()
    batch_size = card.backend.batch_size
    # tokenization runs a few windows ahead of capture, on its own thread
    samples: Iterable[TokenizedSample] = session.samples(
        rows,
        report=source_report,
        strict=opts.strict,
        rank=opts.rank,
        world_size=opts.world_size,
        depth=READ_AHEAD_WINDOWS * batch_size,
    )
    settings = (active() or ProgressSettings()) if opts.progress else None
    expected = _expected_samples(session.source, opts, rows.total)  # also the manifest's record of a running build
    shown = RegenerationProgress(expected, settings) if regen is not None else None
    regenerated = regen.regenerate(samples, shown) if regen is not None else None
    task: Task | None = None
    try:
        build = running_state(card, given_out, opts, expected)
        with _open_writer(session, out_dir, opts, regen, build) as writer:
            task = Task("build", "samples", expected, settings=settings, sizes=writer.progress_bytes)
            _store(_capture(session.backend, regenerated or samples, batch_size, writer, report, task), writer, report, task, shown)
            if regen is not None:
                regen.record_file(writer)
            writer.finish_build(build)
    finally:
        if regenerated is not None:
            regenerated.close()  # stops the regeneration pump at once when capture or the writer failed
            shown.close()
        if task is not None:
            task.close(ok=sys.exc_info()[0] is None)  # after the writer closed: its last shard is published
    report.take_writer(writer.report)
    report.dataset_id, report.identity = writer.manifest.dataset_id, writer.manifest.identity
    report.take_source(source_report)
    if regen is not None:
        report.regeneration = asdict(regen.report)
    report.elapsed_s = time.perf_counter() - started
    save_run_report(out_dir, report)
    return report


def _open_writer(session: CaptureSession, out_dir: Path, opts: BuildOptions, regen: Regeneration | None, build: BuildState) -> ShardWriter:
    """The dataset directory, created or resumed; each rank of a split build writes its own shard names."""
    metadata = session.metadata if regen is None else replace(session.metadata, regeneration=regen.record())
    return ShardWriter(
        out_dir,
        metadata,
        final_norm_weight=session.info.final_norm_weight,
        storage=session.card.shards.storage,
        shard_bytes=session.card.shards.bytes,
        shard_prefix=f"rank{opts.rank:05d}-" if opts.world_size > 1 else "",
        writer_threads=opts.writer_threads,
        build=build,
    )


def _store(
    results: Iterable[CaptureResult], writer: ShardWriter, report: RunReport, task: Task, shown: RegenerationProgress | None
) -> None:
    """Write each captured sample and count each capture failure; ``task`` shows the progress, ``shown`` the regeneration's."""
    for result in results:
        tokens = 0
        if isinstance(result, CaptureFailure):
            report.capture_failures.append({"sample_id": result.sample_id, "reason": result.reason})
        elif writer.add(result):
            tokens = result.num_tokens
            report.tokens_written += tokens
            if shown is not None:
                shown.captured(tokens)
        task.advance(tokens=tokens)


def _capture(
    backend: CaptureBackend, samples: Iterable[TokenizedSample], batch_size: int, writer: ShardWriter, report: RunReport, task: Task
) -> Iterator[CaptureResult]:
    """Yield capture results for every sample not yet stored (those stored count as done in ``task``, untimed).

    Fixed windows of the source order form the batches; a window whose members are
    all stored is skipped without a forward pass.
    """
    if not backend.fixed_batches:

        def missing() -> Iterator[TokenizedSample]:
            for sample in samples:
                report.samples_considered += 1
                if writer.contains(sample.sample_id):
                    report.skipped_existing += 1
                    task.advance(fresh=False)
                else:
                    yield sample

        yield from backend.capture_stream(missing(), batch_size)
        return
    for batch in batches(samples, batch_size):
        report.samples_considered += len(batch)
        todo = [s for s in batch if not writer.contains(s.sample_id)]
        report.skipped_existing += len(batch) - len(todo)
        task.advance(len(batch) - len(todo), fresh=False)
        if not todo:
            continue
        wanted = {s.sample_id for s in todo}
        for result in backend.capture_batch(batch):
            if result.sample_id in wanted:
                yield result
        crash_point("pipeline.after_batch")


def _expected_samples(source: Any, opts: BuildOptions, known: int | None = None) -> int | None:
    """Rows this rank will see, for the progress total and ETA (None when unknown cheaply)."""
    rows: int | None = known
    if isinstance(source, (str, os.PathLike)) and str(source).endswith(".jsonl") and Path(source).is_file():
        with open(source, "rb") as f:
            rows = sum(1 for line in f if line.strip())
    elif hasattr(source, "__len__"):
        rows = len(source)
    if opts.num_samples is not None:
        rows = opts.num_samples if rows is None else min(rows, opts.num_samples)
    if rows is None:
        return None
    return len(range(opts.rank, rows, opts.world_size))

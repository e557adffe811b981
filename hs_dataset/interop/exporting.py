"""The one resumable export loop; each trainer's exporter fills its hooks (the twin of :mod:`.importing`).

:func:`run_export` does what every export does, in this order: open the dataset, ask the
exporter for its :class:`ExportPlan` (every check runs here, before anything is
written), make the destination ready (:func:`~hs_dataset.interop.common.prepare_destination`:
resume, refuse or ``overwrite``), write the export record ``in_progress``, remove the
temp files a crash left, then write one file per sample -- a file an earlier run left
complete and valid is kept, an invalid one rewritten, each written atomically --, remove
sample files beyond the source's samples, let the exporter write its side files, and
rewrite the record ``complete``.

A trainer's exporter (:class:`TrainerExporter`) says only what is its own: the checks
and layer record (:meth:`~TrainerExporter.plan`), what the report says
(:meth:`~TrainerExporter.describe`), where sample ``idx`` goes and what it becomes on
disk, whether a file there is complete, and its side files. An unexpected failure
inside a hook is one :class:`ExportHookError` naming the trainer, the hook and the
sample; the refusals a hook raises on purpose (:class:`~hs_dataset.errors.HsDatasetError`)
and I/O errors pass through as they are.
"""

from __future__ import annotations

import os
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from hs_dataset.errors import HsDatasetError
from hs_dataset.formats.vocabulary import check_token_ids, vocab_size_of
from hs_dataset.interop.common import (
    ExportError,
    ExportReport,
    base_record,
    prepare_destination,
    quarantined_count,
    remove_temp_files,
    write_export_record,
    write_file_atomic,
)
from hs_dataset.interop.settings import ExportSettings
from hs_dataset.progress.task import task

if TYPE_CHECKING:  # pragma: no cover
    from hs_dataset.formats.reader import HiddenStateDataset

__all__ = ["ExportHookError", "ExportPlan", "TrainerExporter", "run_export"]

# warnings.warn's stacklevel that names the caller of export_<trainer>, which calls run_export
_CALLER_OF_THE_EXPORT = 3


_IDS_FIX = "a shard was altered after capture (hs-dataset verify names it): restore it or rebuild the dataset"


class ExportHookError(ExportError):
    """A trainer exporter's hook failed unexpectedly; the message names the trainer, the hook and the sample."""


@dataclass(frozen=True)
class ExportPlan:
    """What an exporter decided before anything is written.

    ``resume_key``: the options a rerun must repeat to resume (recorded). ``layers``:
    the export record's ``layers``. ``warnings``: said as :class:`UserWarning` too (the
    report's notes carry them as well).
    """

    resume_key: dict[str, Any]
    layers: dict[str, Any]
    warnings: tuple[str, ...] = ()


class TrainerExporter(ABC):
    """One trainer's part of an export: the hooks :func:`run_export` calls.

    ``target`` is the trainer's registry name (the report's and the record's ``target``).
    ``sample_glob``, ``sample_prefix`` and ``sample_suffix`` find the per-sample files
    under the destination (``{prefix}{idx}{suffix}``), so that files beyond the source's
    samples -- from an older, larger export, which the trainer would read -- are removed.
    """

    target: ClassVar[str]
    sample_glob: ClassVar[str]
    sample_prefix: ClassVar[str]
    sample_suffix: ClassVar[str]

    def __init__(self, ds: HiddenStateDataset, dest: Path, settings: ExportSettings) -> None:
        self.ds = ds
        self.dest = dest
        self.settings = settings

    @abstractmethod
    def plan(self) -> ExportPlan:
        """Check the data against the trainer's conventions (refusals name the mismatch) and decide the layers."""

    def describe(self, report: ExportReport) -> None:  # noqa: B027  (optional hook: a no-op unless the exporter overrides it)
        """Fill the report's layers and notes (nothing is written yet)."""

    def begin(self) -> None:  # noqa: B027  (optional hook: a no-op unless the exporter overrides it)
        """Make the layout's directories (the record is written, stale temp files are gone)."""

    def observe(self, sample: dict[str, Any]) -> None:  # noqa: B027  (optional hook: a no-op unless the exporter overrides it)
        """See every sample, written or kept (e.g. to build an index over all of them)."""

    @abstractmethod
    def sample_path(self, idx: int) -> Path:
        """Where sample ``idx`` goes."""

    @abstractmethod
    def is_complete(self, path: Path, sample: dict[str, Any]) -> bool:
        """Whether the file an earlier run left at ``path`` holds ``sample`` completely (kept) or not (rewritten)."""

    @abstractmethod
    def encode(self, sample: dict[str, Any]) -> Sequence[memoryview | bytes]:
        """The bytes of the sample's file."""

    def finish(self, record: dict[str, Any]) -> None:  # noqa: B027  (optional hook: a no-op unless the exporter overrides it)
        """Write the side files (index, vocabulary counts, norm) after every sample file; may add to ``record``."""


def run_export(
    exporter_class: type[TrainerExporter], src: str | os.PathLike[str], dest: str | os.PathLike[str], settings: ExportSettings
) -> ExportReport:
    """Export dataset ``src`` to ``dest`` with ``exporter_class``; an interrupted export of the same source resumes.

    An unfinished build is refused before ``dest`` is touched unless ``settings.allow_incomplete``.
    """
    from hs_dataset.formats.build_state import refuse_unfinished
    from hs_dataset.formats.reader import open_dataset

    given, src, dest = src, Path(src), Path(dest)
    ds = open_dataset(src, verify_hashes=settings.verify_hashes)
    if not settings.allow_incomplete:
        refuse_unfinished(given, ds.manifest, "export")
    exporter = exporter_class(ds, dest, settings)
    with _hook(exporter, "plan"):
        plan = exporter.plan()
    resumed = prepare_destination(src, dest, target=exporter.target, resume_key=plan.resume_key, overwrite=settings.overwrite)
    report = ExportReport(target=exporter.target, source=str(src), dest=str(dest), resumed=resumed)
    report.quarantined_not_exported = quarantined_count(ds)
    with _hook(exporter, "describe"):
        exporter.describe(report)
    for message in plan.warnings:
        warnings.warn(message, UserWarning, stacklevel=_CALLER_OF_THE_EXPORT)
    record = base_record(ds, exporter.target, plan.resume_key, {"layers": plan.layers, "samples": len(ds)})
    write_export_record(dest, record)
    remove_temp_files(dest)
    with _hook(exporter, "begin"):
        exporter.begin()
    shown = task("export", "samples", len(ds), sizes=lambda: (report.bytes_written, 0))
    vocab_size = vocab_size_of(ds.manifest.metadata)
    for idx, sample in enumerate(shown.track(ds, tokens=lambda s: int(s["input_ids"].shape[0]))):
        check_token_ids(sample["input_ids"], vocab_size, where=str(src), sample=sample["sample_id"], fix=_IDS_FIX)
        _export_sample(exporter, idx, sample, report)
    _remove_stale_sample_files(exporter, report.samples)
    with _hook(exporter, "finish"):
        exporter.finish(record)
    record.update(status="complete", samples=report.samples, tokens=report.tokens)
    write_export_record(dest, record)
    return report


def _export_sample(exporter: TrainerExporter, idx: int, sample: dict[str, Any], report: ExportReport) -> None:
    """Write sample ``idx``'s file, unless an earlier run left it complete."""
    where = f" on sample {idx} ({sample['sample_id']})"
    with _hook(exporter, "observe", where):
        exporter.observe(sample)
    report.samples += 1
    report.tokens += int(sample["input_ids"].shape[0])
    with _hook(exporter, "sample_path", where):
        path = exporter.sample_path(idx)
    if path.exists():
        with _hook(exporter, "is_complete", where):
            complete = exporter.is_complete(path, sample)
        if complete:
            report.files_skipped += 1
            return
        report.files_rewritten += 1
    path.parent.mkdir(parents=True, exist_ok=True)
    with _hook(exporter, "encode", where):
        chunks = exporter.encode(sample)
    report.bytes_written += write_file_atomic(path, chunks)
    report.files_written += 1


def _remove_stale_sample_files(exporter: TrainerExporter, samples: int) -> None:
    """Sample files numbered past the source's samples (an older, larger export): never ours to keep."""
    prefix, suffix = exporter.sample_prefix, exporter.sample_suffix
    for stale in exporter.dest.glob(exporter.sample_glob):
        stem = stale.name[len(prefix) : -len(suffix)]
        if stale.name.startswith(prefix) and stale.name.endswith(suffix) and stem.isdigit() and int(stem) >= samples:
            stale.unlink()


@contextmanager
def _hook(exporter: TrainerExporter, hook: str, where: str = "") -> Iterator[None]:
    """Run one hook: refusals and I/O errors pass as they are, anything else becomes one :class:`ExportHookError`."""
    try:
        yield
    except (HsDatasetError, OSError):
        raise
    except Exception as exc:
        raise ExportHookError(
            f"the {exporter.target} exporter's {hook} hook failed{where}: {type(exc).__name__}: {exc}; "
            "this is a bug of that exporter, please report it with the traceback (--debug)"
        ) from exc

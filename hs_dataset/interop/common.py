"""What the exports (and the imports) to the trainers' layouts share (docs/EXPORTS.md).

Shared rules, implemented here:

* every file is written to a hidden temp name in its final directory, fsynced and
  renamed into place (half-way through, the ``export.mid_file`` crash point);
* ``hs_dataset_export.json`` (the *export record*) is written first with status
  ``in_progress`` and rewritten ``complete`` at the end; it names the source dataset
  and the options, so a rerun of the same export resumes (complete, valid files are
  skipped) while a destination holding anything else is refused unless
  ``overwrite=True``, which deletes an earlier export's own files and nothing else
  (no link is followed; a symlinked destination is refused);
* data that cannot mean what the target expects (layers, final-state kind, norm) is
  refused with a :class:`ExportMismatchError` naming the mismatch, never converted
  silently.

This module stays light at import time (torch and the formats load when used).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hs_dataset import strict_json
from hs_dataset.errors import HsDatasetError
from hs_dataset.formats.paths import make_directory

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from hs_dataset.formats.reader import HiddenStateDataset

__all__ = [
    "EXPORT_RECORD_NAME",
    "ExportError",
    "ExportMismatchError",
    "ExportReport",
    "base_record",
    "check_layer_convention",
    "derive_post_norm",
    "note_source_storage",
    "num_hidden_layers",
    "paths_overlap",
    "prepare_destination",
    "quarantined_count",
    "read_export_record",
    "refuse_to_wipe_dataset",
    "remove_temp_files",
    "select_aux_layers",
    "temp_path",
    "trainer_default_aux_layer_ids",
    "write_export_record",
    "write_file_atomic",
]

EXPORT_RECORD_NAME = "hs_dataset_export.json"
EXPORT_RECORD_FORMAT = "hs_dataset.export"
EXPORT_RECORD_VERSION = 1
_MAX_RECORD_BYTES = 64 * 1024 * 1024
# Export temp files: hidden, and never ending in a name a reader globs for
# (SpecForge lists every *.ckpt under its root; speculators looks up hs_{i}.safetensors).


class ExportError(HsDatasetError):
    """An export (or import) cannot be done as asked: destination, options or input."""


class ExportMismatchError(ExportError):
    """The data cannot satisfy the target's convention (layers, final-state kind, norm)."""


@dataclass
class ExportReport:
    """What one export run did."""

    target: str
    source: str
    dest: str
    samples: int = 0
    tokens: int = 0
    files_written: int = 0
    files_skipped: int = 0  # complete and valid from an earlier, interrupted run
    files_rewritten: int = 0  # present but invalid (truncated, wrong sample), rewritten
    bytes_written: int = 0
    resumed: bool = False
    quarantined_not_exported: int = 0
    source_storage: str = ""  # how the source stores its states (native, fp8, nf4, mxfp4), and what the export wrote
    exported_dtype: str = ""
    layers: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        lines = [
            f"exported {self.samples} samples ({self.tokens} tokens) from {self.source} to {self.dest} as {self.target}",
            f"  files written {self.files_written} ({self.bytes_written / 2**20:.1f} MiB), skipped (already complete) "
            f"{self.files_skipped}, rewritten (invalid) {self.files_rewritten}" + ("; resumed" if self.resumed else ""),
        ]
        if self.source_storage:
            lines.append(f"  states: stored {self.source_storage} in the source, exported as {self.exported_dtype}")
        for key, value in self.layers.items():
            lines.append(f"  {key}: {value}")
        if self.quarantined_not_exported:
            lines.append(f"  {self.quarantined_not_exported} quarantined sample(s) of the source are not exported")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


# ---------------------------------------------------------------------------- files
def temp_path(final: Path) -> Path:
    """The writer's temp name (formats.atomic: one prefix marks every unfinished file), plus
    ``.part`` so that no trainer's glob for ``*.ckpt`` / ``*.safetensors`` picks it up."""
    from hs_dataset.formats.atomic import temp_path_for

    temp = temp_path_for(final)
    return temp.with_name(temp.name + ".part")


def write_file_atomic(final: Path, chunks: Sequence[memoryview | bytes]) -> int:
    """Write ``chunks`` to ``final`` atomically (temp file, fsync, rename, directory fsync).

    The ``export.mid_file`` crash point fires once half of the bytes are in the temp
    file. Returns the number of bytes written.
    """
    from hs_dataset.formats.atomic import atomic_write_chunks

    return atomic_write_chunks(Path(final), chunks, crash_at="export.mid_file", temp=temp_path(Path(final)))


def remove_temp_files(root: Path) -> int:
    """Remove export temp files and temp directories (staged Arrow indexes) a crash left under ``root``."""
    from hs_dataset.formats.atomic import is_temp_name

    removed = 0
    for dirpath, dirs, names in os.walk(root):
        for name in [d for d in dirs if is_temp_name(d)]:
            shutil.rmtree(os.path.join(dirpath, name), ignore_errors=True)
            dirs.remove(name)
            removed += 1
        for name in names:
            if is_temp_name(name):
                try:
                    os.unlink(os.path.join(dirpath, name))
                    removed += 1
                except FileNotFoundError:
                    pass
    return removed


# ---------------------------------------------------------------------------- norm
def derive_post_norm(pre: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """RMSNorm of the pre-norm final state: ``x * rsqrt(mean(x^2) + eps) * weight``.

    Computed in float32 (input and weight promoted), cast once to ``out_dtype``
    (default: the input's dtype), as SGLang's RMSNorm (the server SpecForge's data
    comes from) and docs/FORMAT.md define it.
    """
    import torch

    x = pre.to(torch.float32)
    variance = x.pow(2).mean(dim=-1, keepdim=True)
    y = x * torch.rsqrt(variance + float(eps)) * weight.to(torch.float32)
    return y.to(out_dtype or pre.dtype)


# ---------------------------------------------------------------------------- layers
def trainer_default_aux_layer_ids(num_layers: int) -> list[int]:
    """Both trainers' default aux layers as HF ``hidden_states`` ids, ``[2, L//2, L-3]``
    (speculators' ``resolve_target_layer_ids``; SpecForge's ``[1, L//2-1, L-4]`` of layer outputs, +1)."""
    return [2, num_layers // 2, num_layers - 3]


# ---------------------------------------------------------------------------- source checks
def quarantined_count(ds: HiddenStateDataset) -> int:
    return len(ds.manifest.quarantine)


def note_source_storage(ds: HiddenStateDataset, report: ExportReport, out_dtype: torch.dtype) -> None:
    """Say in the report how the source stores its states and what the export wrote: a lossy source (fp8, 4-bit)
    exported as bf16 is not bf16 data, and a trainer's user must know that the values carry its rounding."""
    from hs_dataset.codecs.registry import get_encoding

    encoding = get_encoding(ds.manifest.state_encoding)
    report.source_storage = encoding.storage or encoding.name
    report.exported_dtype = str(out_dtype).replace("torch.", "")
    if encoding.scaled:
        bits = f"{encoding.storage_torch_dtype.itemsize * 8 // encoding.pack}-bit"
        report.notes.append(
            f"the source states are {bits} ({encoding.name}: {encoding.summary}); they are exported decoded to "
            f"{report.exported_dtype}, so they carry the {bits} rounding: this is not {report.exported_dtype} data captured at full precision"
        )


def check_layer_convention(ds: HiddenStateDataset, target: str) -> None:
    convention = ds.manifest.metadata.convention
    if convention != "hf_hidden_states_index":
        raise ExportMismatchError(
            f"{ds.root}: layer_convention is {convention!r}; {target} export understands only "
            "'hf_hidden_states_index' (aux id k = transformers hidden_states[k])"
        )


def select_aux_layers(ds: HiddenStateDataset, wanted: Sequence[int] | None, target: str) -> tuple[list[int], list[int]]:
    """(positions in the stored K axis, HF ids) of the aux layers to export.

    ``wanted`` (HF ids) picks a subset of the stored aux layers, e.g. 3 of 4; an id
    that the data does not hold is refused by name.
    """
    stored = [int(i) for i in ds.manifest.aux_layer_ids]
    if sorted(set(stored)) != stored:
        raise ExportMismatchError(
            f"{ds.root}: stored aux_layer_ids {stored} are not ascending and distinct; {target} expects ascending layers"
        )
    if wanted is None:
        return list(range(len(stored))), stored
    wanted = [int(i) for i in wanted]
    if sorted(set(wanted)) != wanted:
        raise ExportMismatchError(f"requested aux layers {wanted} must be ascending and distinct ({target} stores them in ascending order)")
    missing = [i for i in wanted if i not in stored]
    if missing:
        raise ExportMismatchError(
            f"requested aux layer(s) {missing} are not in the data: {ds.root} holds aux_layer_ids {stored} "
            "(HF hidden_states indexes); recapture with those layers or pick from the stored ones"
        )
    return [stored.index(i) for i in wanted], wanted


def num_hidden_layers(ds: HiddenStateDataset, override: int | None, target: str) -> int:
    recorded = ds.manifest.metadata.num_hidden_layers
    if override is not None:
        if recorded is not None and int(recorded) != int(override):
            raise ExportMismatchError(f"--num-hidden-layers {override} contradicts the manifest's num_hidden_layers {recorded} ({ds.root})")
        return int(override)
    if recorded is None:
        raise ExportMismatchError(
            f"{ds.root}: the manifest records no num_hidden_layers, so the id of the final state (L) in {target}'s "
            "layer convention is unknown; pass --num-hidden-layers L"
        )
    return int(recorded)


# ---------------------------------------------------------------------------- destination + record
def read_export_record(dest: str | os.PathLike) -> dict[str, Any] | None:
    from hs_dataset.formats.paths import open_member

    if not (Path(dest) / EXPORT_RECORD_NAME).exists():
        return None
    try:  # the record of a directory we are handed is untrusted: no links, bounded size
        with open_member(dest, EXPORT_RECORD_NAME, what="export record") as f:
            record = strict_json.loads(f.read(_MAX_RECORD_BYTES).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or record.get("format") != EXPORT_RECORD_FORMAT:
        return None
    return record


def write_export_record(dest: Path, record: dict[str, Any]) -> None:
    from hs_dataset.formats.atomic import atomic_write_bytes

    atomic_write_bytes(dest / EXPORT_RECORD_NAME, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())


def _is_within(child: Path, parent: Path) -> bool:
    try:
        child.relative_to(parent)
        return True
    except ValueError:
        return False


def paths_overlap(src: Path, dest: Path) -> bool:
    """Whether ``dest`` is ``src``, inside it or holds it (links resolved): an export or import must not write there."""
    src_r, dest_r = src.resolve(), dest.resolve()
    return dest_r == src_r or _is_within(dest_r, src_r) or _is_within(src_r, dest_r)


def refuse_to_wipe_dataset(dest: Path) -> None:
    """``--overwrite`` (export or import) never deletes an hs_dataset dataset: captures cost GPU-days."""
    from hs_dataset.formats.manifest import is_dataset_dir

    if is_dataset_dir(dest):
        raise ExportError(f"{dest} is an hs_dataset dataset directory; --overwrite will not delete it (remove it yourself)")


def refuse_symlinked_destination(dest: Path) -> None:
    """Writes and deletes go to ``dest`` itself, never through a link to another directory."""
    if dest.is_symlink():
        raise ExportError(f"destination {dest} is a symbolic link; pass the directory it points to, or another destination")


# What an export writes, by name: top-level files, and directories with the files inside them (docs/EXPORTS.md).
_OWN_FILES = re.compile(
    r"^(hs_dataset_export\.json|token_freq\.pt|final_norm\.safetensors|dataset_info\.json|state\.json|data-\d+-of-\d+\.arrow)$"
)
_OWN_DIRS = {
    re.compile(r"^hidden_states$"): re.compile(r"^hs_\d+\.safetensors$"),
    re.compile(r"^rows_\d+-\d+$"): re.compile(r"^data_\d+\.ckpt$"),
}


def foreign_entries(dest: Path) -> list[str]:
    """Entries under ``dest`` an export did not write: other names, and any symbolic link (walked without following)."""
    from hs_dataset.formats.atomic import is_temp_name

    foreign: list[str] = []
    for entry in sorted(os.scandir(dest), key=lambda e: e.name):
        if entry.is_symlink():
            foreign.append(entry.name)
        elif is_temp_name(entry.name):
            foreign += [f"{entry.name}/{inner}" for inner in _links_under(Path(entry.path))] if entry.is_dir(follow_symlinks=False) else []
        elif entry.is_dir(follow_symlinks=False):
            inner = next((files for dirs, files in _OWN_DIRS.items() if dirs.match(entry.name)), None)
            if inner is None:
                foreign.append(entry.name)
                continue
            for child in os.scandir(entry.path):
                ours = (
                    not child.is_symlink()
                    and child.is_file(follow_symlinks=False)
                    and (inner.match(child.name) or is_temp_name(child.name))
                )
                if not ours:
                    foreign.append(f"{entry.name}/{child.name}")
        elif not (entry.is_file(follow_symlinks=False) and _OWN_FILES.match(entry.name)):
            foreign.append(entry.name)
    return foreign


def _links_under(root: Path) -> list[str]:
    return [
        os.path.relpath(os.path.join(d, n), root)
        for d, dirs, files in os.walk(root)
        for n in dirs + files
        if os.path.islink(os.path.join(d, n))
    ]


def clear_own_export(dest: Path, problem: str) -> None:
    """``--overwrite``: delete an earlier export in ``dest``, and only that (its record and the files of its layout).

    Anything else there (a file of the user's, a symbolic link, a directory without an
    export record) is refused before anything is deleted; links are never followed.
    """
    refuse_to_wipe_dataset(dest)
    if read_export_record(dest) is None:
        entries = sorted(os.listdir(dest))
        raise ExportError(
            f"{problem}; --overwrite deletes only an earlier hs_dataset export and {dest} holds none "
            f"({len(entries)} entries, e.g. {entries[:3]}): remove them yourself, or choose another destination"
        )
    foreign = foreign_entries(dest)
    if foreign:
        raise ExportError(
            f"{dest} holds entries no export wrote ({len(foreign)}, e.g. {foreign[:3]}); --overwrite deletes only an earlier "
            "export's files: move them away, or choose another destination"
        )
    for entry in os.scandir(dest):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


def prepare_destination(src: Path, dest: Path, *, target: str, resume_key: dict[str, Any], overwrite: bool) -> bool:
    """Make ``dest`` ready for an export of ``src``; returns True when resuming an earlier run.

    Refused: ``dest`` equal to, inside, or containing ``src``; ``dest`` a symbolic link;
    a ``dest`` holding anything but an export of the same source with the same options
    (unless ``overwrite``, which deletes an earlier export and nothing else); and, even
    with ``overwrite``, a ``dest`` that is an hs_dataset dataset directory (delete that
    one yourself).
    """
    refuse_symlinked_destination(dest)
    if paths_overlap(src, dest):
        raise ExportError(f"destination {dest} overlaps the source dataset {src}; export to a separate directory")
    if dest.exists() and not dest.is_dir():
        raise ExportError(f"destination {dest} exists and is not a directory")
    entries = sorted(os.listdir(dest)) if dest.exists() else []
    if not entries:
        make_directory(dest, what="the export destination")
        return False
    record = read_export_record(dest)
    if record is not None:
        differences = [
            f"{key}: {record.get('resume_key', {}).get(key)!r} there, {value!r} now"
            for key, value in resume_key.items()
            if record.get("resume_key", {}).get(key) != value
        ]
        links = [name for name in foreign_entries(dest) if os.path.islink(dest / name)]
        if links:  # a resumed export removes stale files of its layout: never through a link
            raise ExportError(
                f"{dest} holds symbolic links ({links[:3]}); an export never writes one: remove them, or choose another destination"
            )
        if not differences:
            return True
        problem = f"{dest} holds a different export ({'; '.join(differences)})"
    else:
        problem = f"{dest} is not empty ({len(entries)} entries, e.g. {entries[:3]}) and holds no hs_dataset export"
        if not overwrite:  # --overwrite deletes only an earlier export's files: suggesting it here would lead to a second refusal
            raise ExportError(f"{problem}; choose another (new or empty) destination, or empty this one yourself")
    if not overwrite:
        raise ExportError(f"{problem}; pass --overwrite to replace its contents, or choose another destination")
    clear_own_export(dest, problem)
    return False


def base_record(ds: HiddenStateDataset, target: str, resume_key: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    from hs_dataset.version import __version__

    md = ds.manifest.metadata
    return {
        "format": EXPORT_RECORD_FORMAT,
        "format_version": EXPORT_RECORD_VERSION,
        "target": target,
        "status": "in_progress",
        "created_by": f"hs_dataset {__version__}",
        "resume_key": resume_key,
        "source": {
            "path": str(ds.root),
            "dataset_id": ds.manifest.dataset_id,
            "identity": ds.manifest.identity,
            "config_name": md.config_name,
            "model": None if md.model is None else md.model.to_json(),
            "dtype": md.dtype,
            "state_encoding": ds.manifest.state_encoding,
            "final_state": md.final_state,
        },
        **extra,
    }

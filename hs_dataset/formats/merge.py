"""Merge datasets of the same identity (per-rank or per-process parts) into one dataset.

Shards are hard-linked (copied where links are impossible), never rewritten, so a
merge of terabytes is instant and their recorded hashes (BLAKE3, or sha256 for
format-1 parts) stay valid: they are carried over, never recomputed. Each merged shard
records the ``dataset_id`` of the part it came from, which its header carries.
Regenerated-conversations files (``--regenerate``) are copied, not linked (a resumed
part appends to its own in place), under ``part-NNNNN/<name>`` with the part's
``run_report.json`` beside them; the merged manifest lists each with the part's
recorded sha256, so ``verify`` proves they are the files the parts' builds wrote.
``hs-dataset merge PART... OUT`` verifies the result.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from hs_dataset.errors import ForeignDatasetError, IntegrityError
from hs_dataset.formats.atomic import publish, temp_path_for
from hs_dataset.formats.build_state import merged_build, refuse_unfinished
from hs_dataset.formats.dirlock import LOCK_NAME, acquire_dir_lock, release_dir_lock
from hs_dataset.formats.identity import describe_differences, identity_differences, identity_fields
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest, ShardRecord
from hs_dataset.formats.metadata import RegeneratedFile
from hs_dataset.formats.paths import check_local_path, open_regular, resolve_member
from hs_dataset.formats.reader import ShardReader
from hs_dataset.progress.task import Task, task

_PART_RE = re.compile(r"^part-\d{5}/")
_RUN_REPORT = "run_report.json"
# Regeneration metadata that may differ between parts of one build: file names, and where each node's servers were.
_PER_PART_KEYS = ("file", "files")
_PER_PART_GENERATOR_KEYS = ("servers", "served_model", "concurrency", "concurrency_from")  # where, and how many requests at once
# Recorded only by newer builds and derived from the chat template (which the identity compares): a part that does not
# record them is compared on the rest, not refused as another build.
_RECORDED_SINCE_KEYS = ("structure_token_ids",)

__all__ = ["check_compatible", "merge_datasets"]


def _publish_link(src: Path, dst: Path, *, link: bool = True) -> None:
    """Hard-link (or copy; always with ``link=False``) ``src`` to a temp name beside ``dst``, then rename it over ``dst``.

    Never unlinks first and never writes through ``dst`` (rename replaces a planted
    link itself, not its target); a ``dst`` that already is ``src`` is kept.
    """
    if not src.is_file():
        raise IntegrityError(f"{src}: listed in its manifest but missing (or not a file); restore the part before merging")
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        if os.path.samestat(os.lstat(dst), os.lstat(src)):
            return
    except FileNotFoundError:
        pass
    temp = temp_path_for(dst)
    try:
        if not link:
            raise OSError("copy requested")
        os.link(src, temp)
    except OSError:
        with (
            open_regular(src, what="file") as f_in,
            open(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "wb") as f_out,
        ):
            shutil.copyfileobj(f_in, f_out, 8 * 1024 * 1024)
            f_out.flush()
            os.fsync(f_out.fileno())
    publish(temp, dst)


def _load_parts(parts: list[str | os.PathLike]) -> list[tuple[Path, Manifest]]:
    """Every part's manifest; the same part given twice (by path or dataset id) is refused before anything is written."""
    loaded: list[tuple[Path, Manifest]] = []
    for p in parts:
        path = Path(p)
        manifest = Manifest.load(path)
        for other_path, other in loaded:
            if os.path.realpath(path) == os.path.realpath(other_path) or manifest.dataset_id == other.dataset_id:
                raise IntegrityError(f"{path} and {other_path} are the same part (dataset id {manifest.dataset_id}); give each part once")
        loaded.append((path, manifest))
    return loaded


def check_compatible(loaded: list[tuple[Path, Manifest]]) -> None:
    """Parts must be one dataset stored one way: identity, tensor encodings and final norm all equal."""
    first_path, first = loaded[0]
    for path, manifest in loaded[1:]:
        differences = identity_differences(identity_fields(first.metadata), identity_fields(manifest.metadata))
        if differences:  # compared field by field: parts written before and after the identity was narrowed still merge
            raise ForeignDatasetError(
                f"{path} holds a different dataset than {first_path}; these fields differ:\n"
                f"{describe_differences(differences, stored='first part', wanted='this part')}\nonly parts of one build can be merged"
            )
        if manifest.tensors != first.tensors:
            raise ForeignDatasetError(
                f"{path} stores tensors as {_encodings(manifest)} but {first_path} as {_encodings(first)}; "
                "merge only parts written with the same --storage (or rebuild one of them)"
            )
        if manifest.metadata.final_norm != first.metadata.final_norm:
            raise ForeignDatasetError(
                f"{path} and {first_path} record different final norms (metadata.final_norm); only parts of one build can be merged"
            )
        _check_same_regeneration(path, manifest, first_path, first)


def _regeneration_params(manifest: Manifest) -> dict[str, Any] | None:
    """``metadata.regeneration`` without what may differ per part (file names, server addresses)."""
    entry = manifest.metadata.regeneration
    if entry is None:
        return None
    params = {k: v for k, v in entry.to_json().items() if k not in _PER_PART_KEYS}
    if isinstance(params.get("generator"), dict):
        params["generator"] = {k: v for k, v in params["generator"].items() if k not in _PER_PART_GENERATOR_KEYS}
    return params


def _check_same_regeneration(path: Path, manifest: Manifest, first_path: Path, first: Manifest) -> None:
    """Parts whose turns were written differently (or not at all) are not one dataset; name the first field that differs."""
    mine, theirs = _regeneration_params(manifest), _regeneration_params(first)
    if isinstance(mine, dict) and isinstance(theirs, dict):
        for key in _RECORDED_SINCE_KEYS:
            if mine.get(key) is None or theirs.get(key) is None:
                mine.pop(key, None)
                theirs.pop(key, None)
    if mine == theirs:
        return
    if not isinstance(mine, dict) or not isinstance(theirs, dict):
        raise ForeignDatasetError(
            f"{path} and {first_path} differ in metadata.regeneration (one was built with --regenerate, the other not); "
            "merge only parts of one build"
        )
    field = next(k for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k))
    raise ForeignDatasetError(
        f"{path} and {first_path} regenerated with different metadata.regeneration.{field} ({mine.get(field)!r} vs "
        f"{theirs.get(field)!r}); merge only parts built with the same regenerate settings and model"
    )


def _encodings(manifest: Manifest) -> dict[str, str]:
    return {name: str(entry.get("encoding")) for name, entry in manifest.tensors.items()}


def _check_apart(out: Path, loaded: list[tuple[Path, Manifest]]) -> None:
    """``out`` is not a part nor inside one (checked before anything, even ``mkdir``, touches a part)."""
    real_out = Path(os.path.realpath(out))
    for path, _ in loaded:
        real = Path(os.path.realpath(path))
        if real_out == real or real in real_out.parents:
            raise ForeignDatasetError(f"output {out} is the part {path} or inside it; merge into a new directory")


def _check_out(out: Path, loaded: list[tuple[Path, Manifest]]) -> None:
    """``out`` is empty or a previous merge of the same dataset (checked under the lock)."""
    entries = [e for e in os.listdir(out) if e != LOCK_NAME]
    if not entries:
        return
    if MANIFEST_NAME not in entries:
        raise ForeignDatasetError(f"{out} is not empty and holds no dataset ({sorted(entries)[:3]}); merge into a new or empty directory")
    previous = Manifest.load(out)
    if previous.identity != loaded[0][1].identity or not all(_PART_RE.match(r.file) for r in previous.shards):
        raise ForeignDatasetError(f"{out} already holds another dataset (not a merge of these parts); merge into a new directory")


def merge_datasets(
    parts: list[str | os.PathLike], out: str | os.PathLike, *, check_ids: bool = True, allow_incomplete: bool = False
) -> Manifest:
    """Write ``out/manifest.json`` listing every part's shards (linked under ``out/part-NNNNN/``).

    Holds ``out``'s writer lock throughout, so a build writing there is never interleaved. A part whose build has not
    finished is refused before anything is written unless ``allow_incomplete`` (the merged dataset then records an
    unfinished build too): a merge would otherwise bury half a part in a whole.
    """
    if not parts:
        raise ValueError("merge needs at least one part")
    out = check_local_path(out, what="merge output")
    loaded = _load_parts(parts)
    if not allow_incomplete:
        for part, (_path, manifest) in zip(parts, loaded):
            refuse_unfinished(part, manifest, "merge")
    check_compatible(loaded)
    _check_apart(out, loaded)
    out.mkdir(parents=True, exist_ok=True)
    lock = acquire_dir_lock(out)
    shown = task("merge", "shards", sum(len(manifest.shards) for _, manifest in loaded), verb="linked")
    try:
        _check_out(out, loaded)
        merged = _merge_into(out, loaded, check_ids, shown)
        shown.close()
    finally:
        shown.close(ok=False)  # after a failure only: a closed task stays closed
        release_dir_lock(lock)
    return merged


def _merge_into(out: Path, loaded: list[tuple[Path, Manifest]], check_ids: bool, shown: Task) -> Manifest:
    shards: list[ShardRecord] = []
    quarantine: list[dict[str, str]] = []
    regenerated: dict[str, RegeneratedFile] = {}
    seen: dict[str, str] = {}
    for index, (path, manifest) in enumerate(loaded):
        for number, record in enumerate(manifest.shards):
            src = resolve_member(path, record.file, what=f"shards[{number}].file")
            name = f"part-{index:05d}/{Path(record.file).name}"
            if check_ids:
                for sid in ShardReader(src, manifest=manifest, record=record).sample_ids:
                    if sid in seen:
                        raise IntegrityError(f"sample {sid!r} is in both {seen[sid]} and {src}; parts must not overlap")
                    seen[sid] = str(src)
            _publish_link(src, resolve_member(out, name, what="merged shard"))
            shards.append(replace(record, file=name, dataset_id=manifest.dataset_id))  # every recorded hash carries over
            shown.advance(tokens=record.tokens, nbytes=record.bytes)
        quarantine.extend(manifest.quarantine)
        regenerated.update(_copy_regenerated(path, manifest, out, f"part-{index:05d}"))
    first_path, first = loaded[0]
    metadata = first.metadata
    if metadata.regeneration is not None:  # many files now; ``files`` lists them, not ``file``
        entry = metadata.regeneration.without("file").without("files")
        metadata = replace(metadata, regeneration=replace(entry, files=regenerated))
    norm = metadata.final_norm
    if norm is not None and norm.weight_file is not None:
        what = "metadata.final_norm.weight_file"
        _publish_link(resolve_member(first_path, norm.weight_file, what=what), resolve_member(out, norm.weight_file, what=what))
    merged = Manifest(
        dataset_id=uuid.uuid4().hex,
        metadata=metadata,
        tensors=first.tensors,
        shards=shards,
        quarantine=quarantine,
        created_by=first.created_by,
        identity=first.identity,
        build=merged_build([manifest.build for _, manifest in loaded]),
    )
    merged.save(out)
    return merged


def _copy_regenerated(part: Path, manifest: Manifest, out: Path, prefix: str) -> dict[str, RegeneratedFile]:
    """Copy the part's regenerated files (and its run report, which accounts for capture failures) under ``prefix/``.

    Returns the merged ``files`` entries: the part's recorded sha256 and record count,
    not re-hashed here, so ``verify`` of the merge compares the copy with what the build wrote.
    """
    entry = manifest.metadata.regeneration
    if entry is None:
        return {}
    files = entry.files
    if not files:
        raise IntegrityError(
            f"{part / MANIFEST_NAME}: metadata.regeneration.files is missing; finish the part's build (resume it) before merging"
        )
    merged: dict[str, RegeneratedFile] = {}
    for name, info in files.items():
        what = f"metadata.regeneration.files[{name!r}]"
        src = resolve_member(part, name, what=what)
        _publish_link(src, resolve_member(out, f"{prefix}/{name}", what=what), link=False)
        merged[f"{prefix}/{name}"] = info
    for parent in sorted({n.rpartition("/")[0] for n in files}):
        report = f"{parent}/{_RUN_REPORT}" if parent else _RUN_REPORT
        src = resolve_member(part, report, what="run report")
        if src.is_file():
            _publish_link(src, resolve_member(out, f"{prefix}/{report}", what="run report"), link=False)
    return merged

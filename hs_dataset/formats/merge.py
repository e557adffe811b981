"""Merge datasets of the same identity (per-rank or per-process parts) into one dataset.

Shards are hard-linked (copied where links are impossible), never rewritten, so a
merge of terabytes is instant and their hashes stay valid. Each merged shard
records the ``dataset_id`` of the part it came from, which its header carries.
``hs-dataset merge PART... OUT`` verifies the result.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

from hs_dataset.errors import ForeignDatasetError, IntegrityError
from hs_dataset.formats.atomic import publish, temp_path_for
from hs_dataset.formats.dirlock import LOCK_NAME, acquire_dir_lock, release_dir_lock
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest, ShardRecord
from hs_dataset.formats.paths import open_regular, resolve_member
from hs_dataset.formats.reader import ShardReader

_PART_RE = re.compile(r"^part-\d{5}/")

__all__ = ["merge_datasets"]


def _publish_link(src: Path, dst: Path) -> None:
    """Hard-link (or copy) ``src`` to a temp name beside ``dst``, then rename it over ``dst``.

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
        os.link(src, temp)
    except OSError:
        with open_regular(src, what="shard") as f_in, open(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "wb") as f_out:
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
                raise IntegrityError(
                    f"{path} and {other_path} are the same part (dataset id {manifest.dataset_id}); give each part once"
                )
        loaded.append((path, manifest))
    return loaded


def _check_compatible(loaded: list[tuple[Path, Manifest]]) -> None:
    """Parts must be one dataset stored one way: identity, tensor encodings and final norm all equal."""
    first_path, first = loaded[0]
    for path, manifest in loaded[1:]:
        if manifest.identity != first.identity:
            raise ForeignDatasetError(
                f"{path} holds a different dataset than {first_path} (config {manifest.metadata.get('config_name')!r} vs "
                f"{first.metadata.get('config_name')!r}); only parts of one build can be merged"
            )
        if manifest.tensors != first.tensors:
            raise ForeignDatasetError(
                f"{path} stores tensors as {_encodings(manifest)} but {first_path} as {_encodings(first)}; "
                "merge only parts written with the same --storage (or rebuild one of them)"
            )
        if manifest.metadata.get("final_norm") != first.metadata.get("final_norm"):
            raise ForeignDatasetError(f"{path} and {first_path} record different final norms (metadata.final_norm); only parts of one build can be merged")


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


def merge_datasets(parts: list[str | os.PathLike], out: str | os.PathLike, *, check_ids: bool = True) -> Manifest:
    """Write ``out/manifest.json`` listing every part's shards (linked under ``out/part-NNNNN/``).

    Holds ``out``'s writer lock throughout, so a build writing there is never interleaved.
    """
    if not parts:
        raise ValueError("merge needs at least one part")
    out = Path(out)
    loaded = _load_parts(parts)
    _check_compatible(loaded)
    _check_apart(out, loaded)
    out.mkdir(parents=True, exist_ok=True)
    lock = acquire_dir_lock(out)
    try:
        _check_out(out, loaded)
        merged = _merge_into(out, loaded, check_ids)
    finally:
        release_dir_lock(lock)
    return merged


def _merge_into(out: Path, loaded: list[tuple[Path, Manifest]], check_ids: bool) -> Manifest:
    shards: list[ShardRecord] = []
    quarantine: list[dict[str, str]] = []
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
            shards.append(ShardRecord(name, record.samples, record.tokens, record.bytes, record.sha256, dataset_id=manifest.dataset_id))
        quarantine.extend(manifest.quarantine)
    first_path, first = loaded[0]
    metadata = dict(first.metadata)
    norm = metadata.get("final_norm") or {}
    if "weight_file" in norm:
        what = "metadata.final_norm.weight_file"
        _publish_link(resolve_member(first_path, norm["weight_file"], what=what), resolve_member(out, norm["weight_file"], what=what))
    merged = Manifest(
        dataset_id=uuid.uuid4().hex,
        metadata=metadata,
        tensors=first.tensors,
        shards=shards,
        quarantine=quarantine,
        created_by=first.created_by,
        identity=first.identity,
    )
    merged.save(out)
    return merged

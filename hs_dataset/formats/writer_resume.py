"""Open a dataset directory for writing: a new dataset, or the resumption of the one it holds.

Resuming removes temp files, refuses another dataset (identity or state encoding),
checks that every listed shard is present and whole, adopts complete shards that a
crash left out of the manifest (renaming another dataset's ``*.rejected``), and
collects the sample ids already stored so that none is stored twice.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from hs_dataset.codecs.registry import Encoding
from hs_dataset.codecs.safetensors_layout import read_header
from hs_dataset.errors import ForeignDatasetError, FormatError, HsDatasetError, IntegrityError
from hs_dataset.formats.atomic import fsync_dir, is_temp_name, publish, remove_quietly, temp_path_for
from hs_dataset.formats.build_state import BuildState
from hs_dataset.formats.dirlock import LOCK_NAME
from hs_dataset.formats.hashing import SHARD_HASH, file_digests, sha256_fileobj
from hs_dataset.formats.identity import describe_differences, identity_differences, identity_fingerprint, identity_with_storage
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest, ShardRecord
from hs_dataset.formats.metadata import DatasetMetadata, FinalNorm
from hs_dataset.formats.paths import open_regular, resolve_member
from hs_dataset.formats.repair_record import repair_command
from hs_dataset.formats.shard_file import capture_counts, shard_sample_ids
from hs_dataset.formats.shard_layout import (
    AUX_KEY,
    CAPTURE_PATHS_KEY,
    FINAL_KEY,
    INPUT_IDS_KEY,
    LOSS_MASK_KEY,
    NORM_WEIGHT_FILE,
    NORM_WEIGHT_KEY,
    OFFSETS_KEY,
    SHARD_FORMAT,
    SHARD_NAME_RE,
)
from hs_dataset.formats.writer_session import WriterReport

__all__ = ["OpenedDataset", "WriteTarget", "open_or_resume"]


@dataclass(frozen=True)
class WriteTarget:
    """What a writer writes into ``root``: the dataset it must be (metadata, state encoding) and its shards' prefix."""

    root: Path
    metadata: DatasetMetadata
    encoding: Encoding
    shard_prefix: str
    build: BuildState | None = None  # a build's running record: in the first manifest, so no kill finds a dataset without it


@dataclass
class OpenedDataset:
    """The manifest to extend, the sample ids already stored, and the next shard number of this prefix."""

    manifest: Manifest
    stored_ids: set[str]
    next_seq: int


def open_or_resume(
    target: WriteTarget, report: WriterReport, final_norm_weight: torch.Tensor | None, created_by: str | None
) -> OpenedDataset:
    """Create the dataset in an empty directory, or resume the one it holds (counting what was cleaned in ``report``)."""
    root = target.root
    entries = [e for e in os.listdir(root) if e != LOCK_NAME]
    others = [e for e in entries if not is_temp_name(e)]
    if MANIFEST_NAME not in others:
        # no dataset yet: only what a crash before the first manifest leaves (temp files, the norm weight) is ours
        foreign = [e for e in others if not (e == NORM_WEIGHT_FILE and _is_our_norm_weight(root / e))]
        if foreign:
            raise ForeignDatasetError(
                f"{root} is not empty and holds no hs_dataset manifest ({len(entries)} entries, e.g. {sorted(foreign)[:3]}); "
                "nothing in it was changed: choose an empty or new output directory"
            )
    for name in entries:
        if is_temp_name(name):
            remove_quietly(root / name)
            report.removed_temp_files += 1
    if MANIFEST_NAME in others:
        opened = _resume(target, report, others)
        fsync_dir(root)
        return opened
    if others:  # a crash between publishing the norm weight and the first manifest: nothing else was written
        remove_quietly(root / NORM_WEIGHT_FILE)
    return OpenedDataset(_create(target, final_norm_weight, created_by), set(), 0)


def _is_our_norm_weight(path: Path) -> bool:
    """A plain safetensors file holding only the norm weight tensor, as :func:`_write_norm_weight` writes it."""
    try:
        with open_regular(path, what="norm weight") as f:
            specs, _meta, _start = read_header(f, str(path))
    except (HsDatasetError, OSError):
        return False
    return set(specs) == {NORM_WEIGHT_KEY}


def _tensor_table(target: WriteTarget) -> dict[str, dict[str, Any]]:
    state = {"encoding": target.encoding.name}
    num_aux, hidden_size = len(target.metadata.aux_layer_ids or ()), int(target.metadata.hidden_size or 0)
    table = {
        OFFSETS_KEY: {"encoding": "int64", "shape": ["samples+1"]},
        INPUT_IDS_KEY: {"encoding": "int64", "shape": ["tokens"]},
        LOSS_MASK_KEY: {"encoding": "bool", "shape": ["tokens"]},
        AUX_KEY: {**state, "shape": ["tokens", num_aux, hidden_size]},
        FINAL_KEY: {**state, "shape": ["tokens", hidden_size]},
    }
    if not num_aux:  # the final state only: the shards hold no aux tensor, the table lists none
        del table[AUX_KEY]
    return table


def _create(target: WriteTarget, final_norm_weight: torch.Tensor | None, created_by: str | None) -> Manifest:
    from hs_dataset.version import __version__

    metadata = target.metadata
    if final_norm_weight is not None:
        weight_file, weight_key, weight_sha256 = _write_norm_weight(target.root, final_norm_weight)
        norm = replace(
            metadata.final_norm or FinalNorm(json_keys=()), weight_file=weight_file, weight_key=weight_key, weight_sha256=weight_sha256
        )
        metadata = replace(metadata, final_norm=norm)
    manifest = Manifest(
        dataset_id=uuid.uuid4().hex,
        metadata=metadata,
        tensors=_tensor_table(target),
        created_by=created_by or f"hs_dataset {__version__}",
        identity=identity_fingerprint(target.metadata),
        build=target.build,
    )
    manifest.save(target.root)
    return manifest


def _write_norm_weight(root: Path, weight: torch.Tensor) -> tuple[str, str, str]:
    """Publish the final norm's weight; returns (file name, tensor key, sha256)."""
    from safetensors.torch import save_file

    final = root / NORM_WEIGHT_FILE
    temp = temp_path_for(final)
    save_file({NORM_WEIGHT_KEY: weight.detach().to("cpu").contiguous()}, str(temp))
    os.chmod(temp, 0o644)
    with open(temp, "rb") as f:
        os.fsync(f.fileno())
        digest = sha256_fileobj(f)
    publish(temp, final)
    return NORM_WEIGHT_FILE, NORM_WEIGHT_KEY, digest


def _resume(target: WriteTarget, report: WriterReport, entries: list[str]) -> OpenedDataset:
    root = target.root
    manifest = Manifest.load(root)
    _check_same_dataset(root, manifest, target)
    listed = {s.file for s in manifest.shards}
    for index, record in enumerate(manifest.shards):
        path = resolve_member(root, record.file, what=f"shards[{index}].file")
        if not path.is_file() or path.stat().st_size != record.bytes:
            raise IntegrityError(
                f"{path}: listed in the manifest but missing or of the wrong size; run `{repair_command(root)}` to capture "
                "its samples again (same model, card and source), or restore the file from a copy"
            )
    for name in sorted(entries):
        match = SHARD_NAME_RE.match(name)
        if match and name not in listed and match.group("prefix") == target.shard_prefix:
            _adopt_orphan(root, manifest, name, report)
    opened = OpenedDataset(manifest, set(), 0)
    for record in manifest.shards:
        match = SHARD_NAME_RE.match(Path(record.file).name)
        opened.stored_ids.update(shard_sample_ids(resolve_member(root, record.file, what="shards[].file")))
        if match and match.group("prefix") == target.shard_prefix:
            opened.next_seq = max(opened.next_seq, int(match.group("seq")) + 1)
    opened.stored_ids.update(q["sample_id"] for q in manifest.quarantine)
    return opened


def _adopt_orphan(root: Path, manifest: Manifest, name: str, report: WriterReport) -> None:
    """A crash between rename and manifest update leaves a complete shard: hash it and list it."""
    path = root / name
    try:
        with open_regular(path, what="unlisted shard") as f:
            specs, meta, _ = read_header(f, str(path))
            if meta.get("dataset_id") != manifest.dataset_id or meta.get("format") != SHARD_FORMAT:
                raise FormatError(f"{path}: belongs to another dataset")
            digest = file_digests(f, (SHARD_HASH,))[SHARD_HASH]
        ids = json.loads(meta["sample_ids"])
        paths = json.loads(meta.get(CAPTURE_PATHS_KEY, "[]"))
        captured_by = capture_counts([str(p) for p in paths]) if isinstance(paths, list) else None
        record = ShardRecord(
            name, len(ids), int(specs[INPUT_IDS_KEY].shape[0]), path.stat().st_size, blake3=digest, captured_by=captured_by
        )
    except (FormatError, KeyError, ValueError, OSError):
        os.replace(path, root / f"{name}.rejected")
        report.rejected_shards.append(name)
        return
    manifest.shards.append(record)
    manifest.shards.sort(key=lambda s: s.file)
    manifest.save(root)
    report.adopted_shards.append(name)


def _check_same_dataset(root: Path, manifest: Manifest, target: WriteTarget) -> None:
    """Refuse to resume another dataset, naming each identity field that differs (``formats/identity.py``).

    The stored metadata is re-projected onto today's identity fields, so a dataset written
    when the identity hashed the whole card resumes under a card that differs only in
    what does not define the data.
    """
    stored = identity_with_storage(manifest.metadata, manifest.tensors.get(FINAL_KEY, {}).get("encoding"))
    differences = identity_differences(stored, identity_with_storage(target.metadata, target.encoding.name))
    if differences:
        raise ForeignDatasetError(
            f"{root} already holds a different dataset; these fields differ:\n{describe_differences(differences)}\n"
            f"use a new --out directory, or restore these fields in the card to resume {root} (a repair too re-captures "
            "with the same model, card and source)"
        )

"""Merge datasets of the same identity (per-rank or per-process parts) into one dataset.

Shards are hard-linked (copied where links are impossible), never rewritten, so a
merge of terabytes is instant and their hashes stay valid. Each merged shard
records the ``dataset_id`` of the part it came from, which its header carries.
``hs-dataset merge OUT PART...`` verifies the result.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import uuid
from pathlib import Path

from hs_dataset.errors import ForeignDatasetError, IntegrityError
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest, ShardRecord
from hs_dataset.formats.reader import ShardReader

__all__ = ["merge_datasets", "add_arguments", "run"]


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        if dst.stat().st_size == src.stat().st_size:
            return
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def merge_datasets(parts: list[str | os.PathLike], out: str | os.PathLike, *, check_ids: bool = True) -> Manifest:
    """Write ``out/manifest.json`` listing every part's shards (linked under ``out/<part name>/``)."""
    if not parts:
        raise ValueError("merge needs at least one part")
    out = Path(out)
    manifests = [(Path(p), Manifest.load(Path(p))) for p in parts]
    first_path, first = manifests[0]
    for path, manifest in manifests[1:]:
        if manifest.identity != first.identity:
            raise ForeignDatasetError(
                f"{path} holds a different dataset than {first_path} (config {manifest.metadata.get('config_name')!r} vs "
                f"{first.metadata.get('config_name')!r}); only parts of one build can be merged"
            )
    out.mkdir(parents=True, exist_ok=True)
    if (out / MANIFEST_NAME).exists() and Manifest.load(out).identity != first.identity:
        raise ForeignDatasetError(f"{out} already holds another dataset; merge into a new directory")
    shards: list[ShardRecord] = []
    quarantine: list[dict[str, str]] = []
    seen: dict[str, str] = {}
    for index, (path, manifest) in enumerate(manifests):
        prefix = f"part-{index:05d}"
        for record in manifest.shards:
            src = path / record.file
            name = f"{prefix}/{Path(record.file).name}"
            if check_ids:
                for sid in ShardReader(src, manifest=manifest, record=record).sample_ids:
                    if sid in seen:
                        raise IntegrityError(f"sample {sid!r} is in both {seen[sid]} and {src}; parts must not overlap")
                    seen[sid] = str(src)
            _link_or_copy(src, out / name)
            shards.append(ShardRecord(name, record.samples, record.tokens, record.bytes, record.sha256, dataset_id=manifest.dataset_id))
        quarantine.extend(manifest.quarantine)
    metadata = dict(first.metadata)
    norm = metadata.get("final_norm") or {}
    if "weight_file" in norm:
        _link_or_copy(first_path / norm["weight_file"], out / norm["weight_file"])
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", help="directory of the merged dataset")
    parser.add_argument("parts", nargs="+", help="dataset directories to merge (e.g. one per rank)")


def run(args: argparse.Namespace) -> int:
    from hs_dataset.formats.verify import verify_dataset

    merge_datasets(args.parts, args.out)
    result = verify_dataset(args.out)
    if not result.ok:
        for problem in result.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 1
    print(f"merged {len(args.parts)} parts: {result.summary()}")
    return 0

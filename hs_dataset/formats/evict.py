"""Drop whole shards from a dataset: the manifest stops listing them first, then the files go.

A bounded cache (``hs_dataset.streaming.stream``) evicts its oldest shards this way. The order
keeps every instant consistent (docs/FORMAT.md: the manifest lists only complete
shards): the manifest is rewritten atomically without the shards (``atomic.py``), and
only then are the files unlinked. A crash between the two steps leaves complete shards
that the manifest no longer lists; a writer reopening the directory adopts them again
(they are valid data of this dataset), so nothing is ever listed but missing.

The caller holds the directory lock (``dirlock.py``): eviction rewrites the manifest.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from hs_dataset.errors import FormatError
from hs_dataset.formats.atomic import fsync_dir, remove_quietly
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest, ShardRecord
from hs_dataset.formats.paths import resolve_member

__all__ = ["evict_shards"]


def evict_shards(root: str | os.PathLike, files: Iterable[str]) -> list[ShardRecord]:
    """Remove the listed shards ``files`` from ``root``'s manifest (atomically), then delete them.

    Returns the removed records (in manifest order). Every name must be listed: a name
    the manifest does not hold is refused before anything changes.
    """
    root = Path(root)
    wanted = list(dict.fromkeys(files))
    if not wanted:
        return []
    manifest = Manifest.load(root)
    listed = {record.file for record in manifest.shards}
    unknown = [name for name in wanted if name not in listed]
    if unknown:
        raise FormatError(
            f"{root / MANIFEST_NAME}: cannot evict {unknown[:3]}: not listed in shards[]; evict only names the manifest lists"
        )
    paths = [resolve_member(root, name, what="evicted shard") for name in wanted]  # every name checked before any change
    drop = set(wanted)
    removed = [record for record in manifest.shards if record.file in drop]
    manifest.shards = [record for record in manifest.shards if record.file not in drop]
    manifest.save(root)  # from here on the shards are not part of the dataset
    for path in paths:
        remove_quietly(path)
    fsync_dir(root)
    return removed

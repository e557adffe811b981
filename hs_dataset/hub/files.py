"""A file a push may upload, what the repo already holds at its path, and whether the two are the same bytes.

The comparison is what makes a second push upload nothing: an LFS file is the same when
its oid (sha256) equals the local sha256, a regular file when its git blob id does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hs_dataset.errors import IntegrityError
from hs_dataset.formats.hashing import file_digests
from hs_dataset.formats.paths import open_regular

__all__ = ["LocalFile", "RemoteFile", "batches", "same_bytes"]


@dataclass
class LocalFile:
    """A local file and the repo path it goes to; its sha256 (the LFS oid) is computed on first use."""

    local: Path
    repo_path: str
    size: int
    sha256: str | None = None  # known in advance for format-1 shards and the norm weight
    blake3: str | None = None  # the manifest's hash of a format-2 shard, checked in the read that computes sha256

    def digest(self) -> str:
        """sha256 (the LFS oid), computed on first use; a recorded BLAKE3 is checked in the same read."""
        if self.sha256 is None:
            with open_regular(self.local, what="dataset file") as f:
                digests = file_digests(f, ("sha256", "blake3") if self.blake3 else ("sha256",))
            if self.blake3 and digests["blake3"] != self.blake3:
                raise IntegrityError(
                    f"{self.local}: blake3 {digests['blake3']} != manifest {self.blake3}; not published (corrupted shard: restore it or rebuild it)"
                )
            self.sha256 = digests["sha256"]
        return self.sha256


@dataclass
class RemoteFile:
    """What the repo's file listing says about one file."""

    size: int
    blob_id: str | None
    lfs_sha256: str | None


def _git_blob_sha1(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def same_bytes(local: LocalFile, remote: RemoteFile | None) -> bool:
    """True when the remote file holds exactly the local bytes."""
    if remote is None or remote.size != local.size:
        return False
    if remote.lfs_sha256 is not None:
        return remote.lfs_sha256 == local.digest()
    return remote.blob_id is not None and remote.blob_id == _git_blob_sha1(local.local)


def batches(files: list[LocalFile], max_bytes: int, max_files: int) -> Iterable[list[LocalFile]]:
    """``files`` in order, cut into batches of at most ``max_bytes`` (a bigger file goes alone) and ``max_files``."""
    batch: list[LocalFile] = []
    size = 0
    for f in files:
        if batch and (size + f.size > max_bytes or len(batch) >= max_files):
            yield batch
            batch, size = [], 0
        batch.append(f)
        size += f.size
    if batch:
        yield batch

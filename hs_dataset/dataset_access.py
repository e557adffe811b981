"""A dataset wherever it is: a local directory or an fsspec URL. The one place that tells the two apart.

Opening, verifying, merging, reading a manifest and choosing where a build writes go
through here, so every command treats ``s3://bucket/prefix`` (read through the bounded
cache, written through a local staging directory: docs/REMOTE.md) and a directory alike,
and one that takes only local directories refuses a URL in one line.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hs_dataset.config.remote import RemoteOptions
from hs_dataset.config.run import parse_options
from hs_dataset.errors import FormatError, UsageError
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest
from hs_dataset.formats.paths import check_local_path
from hs_dataset.formats.reader import HiddenStateDataset
from hs_dataset.formats.verify import VerifyResult
from hs_dataset.remote.location import is_url

__all__ = ["merge", "open_dataset", "output_dir", "read_manifest", "verify"]


def open_dataset(path: str | os.PathLike, *, verify_hashes: bool = False, **options: Any) -> HiddenStateDataset:
    """Open a dataset directory, or a dataset at an fsspec URL (``s3://bucket/prefix``) through the bounded cache.

    ``options`` (URLs only): :class:`~hs_dataset.config.remote.RemoteOptions` (cache_dir,
    max_cache_bytes, prefetch_shards, storage_options); unknown ones are refused by name.
    """
    if not is_url(path):
        if options:
            raise UsageError(f"open_dataset({os.fspath(path)!r}): {sorted(options)} apply to URLs only; a local directory is read in place")
        from hs_dataset.formats.reader import open_dataset as open_directory

        return open_directory(path, verify_hashes=verify_hashes)
    from hs_dataset.remote.dataset import RemoteDataset

    return RemoteDataset(os.fspath(path), verify_hashes=verify_hashes, options=parse_options(RemoteOptions, "open_dataset()", options))


def read_manifest(path: str | os.PathLike) -> Manifest:
    """The manifest of the dataset at ``path`` (a directory or a URL), checked as every reader checks it."""
    if is_url(path):
        from hs_dataset.remote.location import open_location

        return open_location(os.fspath(path)).require_manifest()
    return Manifest.load(Path(path).expanduser())


def verify(path: str | os.PathLike, *, check_hashes: bool = True, check_values: bool = True) -> VerifyResult:
    """Check every byte of the dataset at ``path``; a URL's shards are downloaded, so their hashes are always checked."""
    if is_url(path):
        from hs_dataset.remote.verify import verify_remote

        return verify_remote(os.fspath(path), check_values=check_values)
    from hs_dataset.formats.verify import verify_dataset

    directory = check_local_path(path, what="dataset")  # nothing to verify is an error (exit 2), not a finding (exit 1)
    if not directory.exists():
        raise FileNotFoundError(f"{directory}: no such directory")
    if not directory.is_dir():
        raise NotADirectoryError(f"{directory}: a file, not a dataset directory")
    if not (directory / MANIFEST_NAME).exists():
        raise FormatError(f"{directory}: no {MANIFEST_NAME}; this is not an hs_dataset dataset (or nothing was written yet)")
    return verify_dataset(directory, check_hashes=check_hashes, check_values=check_values)


def merge(parts: Sequence[str], out: str, *, allow_incomplete: bool = False) -> VerifyResult:
    """Merge the parts into ``out`` and verify it: all local directories, or all URLs of one store (a manifest operation).

    An unfinished part is refused (:class:`~hs_dataset.errors.IncompleteDatasetError`) unless ``allow_incomplete``.
    """
    urls = [is_url(p) for p in (*parts, out)]
    if any(urls) and not all(urls):
        raise UsageError(
            "give every part and the output as URLs of one store, or all as local directories (upload local parts with build --out URL)"
        )
    if all(urls):
        from hs_dataset.remote.merge import merge_remote

        merge_remote(list(parts), out, allow_incomplete=allow_incomplete)
    else:
        from hs_dataset.formats.merge import merge_datasets

        merge_datasets(list(parts), out, allow_incomplete=allow_incomplete)
    return verify(out)


@contextmanager
def output_dir(out: str | os.PathLike, options: RemoteOptions) -> Iterator[Path]:
    """The local directory a build writes: ``out`` itself, or for a URL a staging directory uploaded as it fills."""
    if is_url(out):
        from hs_dataset.remote.destination import staged_upload

        with staged_upload(os.fspath(out), options) as stage:
            yield stage
    else:
        yield check_local_path(out, what="output directory")

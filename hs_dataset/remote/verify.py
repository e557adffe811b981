"""``hs-dataset verify URL``: the checks of a local verify, on a dataset in object storage, within the cache bound.

Each shard is downloaded, even one the cache holds (the store's bytes are verified),
into a private cache directory of the same bound beside the shared one (in the temp dir where only the
shared one's parent may not be written: a group's cache), removed after (size
and hash checked on the bytes that arrive, so hashes are always checked here), then opened by the one reader (header,
dataset id, dtypes, shapes, offsets) and scanned for NaN/inf; sample ids must be unique
across shards, the final-norm weight must match its sha256, and no shard-named or temp
object may lie beside the manifest unlisted. Shards are read in order with the next ones
prefetched, and let go after, so a dataset larger than the local disk is verified too.
The copies the shared cache holds of the manifest's shards (what ``open_dataset(URL)``
would serve) are hashed too: one whose bytes changed after download is a problem named
by its path (a reader hashes it before use and downloads it again; delete it to be rid of it).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hs_dataset.config.remote import RemoteOptions
from hs_dataset.errors import FormatError, HsDatasetError, IntegrityError, UsageError
from hs_dataset.formats.atomic import is_temp_name
from hs_dataset.formats.hashing import file_digests
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest
from hs_dataset.formats.paths import check_local_path, make_directory, open_regular
from hs_dataset.formats.shard_layout import SHARD_NAME_RE
from hs_dataset.formats.verify import VerifyResult, check_finite
from hs_dataset.remote.cache import INDEX_NAME, cache_name
from hs_dataset.remote.cache_dir import cache_writes
from hs_dataset.remote.dataset import RemoteDataset
from hs_dataset.remote.location import RemoteLocation, open_location, storage_errors

__all__ = ["verify_remote"]


def verify_remote(url: str, *, check_values: bool = True, options: RemoteOptions | None = None, max_problems: int = 20) -> VerifyResult:
    """Every check (see the module docstring); problems are collected, a URL holding no dataset is an error."""
    options = options or RemoteOptions()
    loc = open_location(url, options)
    if loc.size(MANIFEST_NAME) is None:
        raise FormatError(f"{url}: no {MANIFEST_NAME}; this is not an hs_dataset dataset (or nothing was uploaded yet)")
    result = VerifyResult()
    private = _private_cache(check_local_path(options.cache_dir, what="cache_dir"))
    try:
        data = RemoteDataset(url, options=options.model_copy(update={"cache_dir": Path(private)}))
    except HsDatasetError as exc:
        shutil.rmtree(private, ignore_errors=True)
        result.problems.append(str(exc))
        return result
    result.build = data.manifest.build
    try:
        _check_listing(loc, data.manifest, result)
        _check_shards(data, check_values, max_problems, result)
        _check_norm(data, result)
        _check_cached_copies(options.cache_dir, data, max_problems, result)
    finally:
        data.close()
        shutil.rmtree(private, ignore_errors=True)
    return result


def _private_cache(cache_dir: Path) -> str:
    """A new directory for the downloads: beside ``cache_dir`` (its disk), else, for an existing cache_dir, in the temp dir.

    Why the fallback: a cache a group shares (``/data/cache``, group-writable) often lies in
    a directory only its admin may write; its users could not verify a URL at all. A
    cache_dir that does not exist and cannot be created stays an error: it names a mistake.
    A file system that refuses a directory for another reason than a read-only or full disk
    (``cache_writes`` names those), such as /proc, is a UsageError naming cache_dir, not a bare OSError.
    """
    parent = cache_dir.parent
    with cache_writes(cache_dir):
        make_directory(parent, what=f"the directory of cache_dir {cache_dir}")
        try:
            return tempfile.mkdtemp(prefix=f".{cache_dir.name}-verify-", dir=parent)
        except PermissionError:
            if not cache_dir.is_dir():
                raise
            return tempfile.mkdtemp(prefix=f"hs-dataset-verify-{cache_dir.name}-")
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise UsageError(
                f"{cache_dir}: cache_dir cannot be created ({exc.strerror}); give a directory on a writable local file system"
            ) from None


def _check_shards(data: RemoteDataset, check_values: bool, max_problems: int, result: VerifyResult) -> None:
    seen: dict[str, str] = {}
    for index, record in enumerate(data.manifest.shards):
        if len(result.problems) >= max_problems:
            break
        where = f"{data.url}/{record.file}"
        try:
            reader = data.shard(index)
            for sid in reader.sample_ids:
                if sid in seen:
                    raise IntegrityError(f"sample {sid!r} is also stored in {seen[sid]} (duplicate sample id)")
                seen[sid] = record.file
            if check_values:
                check_finite(reader, reader.path)
        except (HsDatasetError, OSError) as exc:
            result.problems.append(f"{where}: {exc}")
            continue
        result.shards += 1
        result.samples += record.samples
        result.tokens += record.tokens
        result.bytes += record.bytes


def _check_cached_copies(cache_dir: Path, data: RemoteDataset, max_problems: int, result: VerifyResult) -> None:
    """Hash the shared cache's copy of each shard, where it holds one: the bytes a reader of the URL would be served.

    Read only: a cache directory that does not exist (or holds no cache) is left as it is.
    """
    if not os.path.isfile(cache_dir / INDEX_NAME):
        return
    for record in data.manifest.shards:
        if len(result.problems) >= max_problems:
            return
        path = cache_dir / cache_name(record)
        if not os.path.lexists(path):
            continue
        try:
            with open_regular(path, what="cached shard") as f:
                digest = file_digests(f, (record.hash_algorithm,))[record.hash_algorithm]
        except (HsDatasetError, OSError) as exc:
            result.problems.append(f"{path}: the cached copy of {data.url}/{record.file} cannot be read ({exc}); delete it")
            continue
        if digest != record.digest:
            result.problems.append(
                f"{path}: the cached copy of {data.url}/{record.file} does not hold the bytes the manifest records "
                f"({record.hash_algorithm} {digest[:16]}... != {record.digest[:16]}...: changed after download); "
                "a reader hashes it before use and downloads the shard again: delete it"
            )


def _check_norm(data: RemoteDataset, result: VerifyResult) -> None:
    if data.manifest.metadata.norm_weight_file is None:
        return
    try:
        data.final_norm()
    except (HsDatasetError, OSError) as exc:
        result.problems.append(str(exc))


def _check_listing(loc: RemoteLocation, manifest: Manifest, result: VerifyResult) -> None:
    """Unlisted shard objects or temp objects beside the manifest (an interrupted upload: rerun it)."""
    listed = {record.file for record in manifest.shards}
    with storage_errors(loc.url):
        loc.fs.invalidate_cache(loc.root)
        try:
            names = [os.path.basename(str(name).rstrip("/")) for name in loc.call("ls", loc.root, detail=False)]
        except FileNotFoundError:  # a store that cannot list a prefix (a plain http:// server): nothing to compare
            names = []
    for name in sorted(names):
        if is_temp_name(name):
            result.leftover(f"{loc.url}/{name}: leftover temp object of an interrupted upload (rerun the build to finish it)")
        elif SHARD_NAME_RE.match(name) and name not in listed:
            result.leftover(f"{loc.url}/{name}: shard object not listed in the manifest (rerun the build to finish its upload)")

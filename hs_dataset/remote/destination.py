"""``build --out URL``: the writer fills a local staging directory; shards are uploaded as they publish.

The local writer stays what it is (disk speed, atomic, resumable). An uploader thread
publishes the staging directory to the URL every ``upload_interval_s`` (shards first,
the manifest last: :mod:`.publish`), and once more when the build ends, so a trainer
following the URL sees shards while the build runs. A rank rerun after a kill resumes
in its staging directory; one whose staging directory was lost (a new node) first
downloads what the URL already holds into a fresh one (hash-checked), so it neither
captures those samples again nor loses them.

Before anything is captured, the destination is checked as a local ``--out`` directory
is: one empty temp object is written and deleted (the bucket exists and the
credentials may write), and the prefix must hold nothing, or this build's dataset
(the staging directory's, or one to resume from): another tool's objects or another
dataset are refused, nothing written.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hs_dataset.config.remote import RemoteOptions
from hs_dataset.errors import ForeignDatasetError, RemoteError, UsageError
from hs_dataset.formats.atomic import TEMP_PREFIX, atomic_write_bytes
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest, is_dataset_dir
from hs_dataset.formats.paths import check_local_path, resolve_member
from hs_dataset.formats.reader import MAX_NORM_WEIGHT_BYTES
from hs_dataset.remote.location import RemoteLocation, open_location, storage_errors
from hs_dataset.remote.publish import publish_dataset, refuse_foreign
from hs_dataset.remote.transfer import Expected, download_file

__all__ = ["seed_from_remote", "stage_dir_for", "staged_upload"]

_log = logging.getLogger("hs_dataset.remote")


def stage_dir_for(url: str, options: RemoteOptions) -> Path:
    """The staging directory of ``url``: the one configured, else one per URL beside the cache."""
    if options.stage_dir is not None:
        return check_local_path(options.stage_dir, what="stage_dir")
    return check_local_path(options.cache_dir, what="cache_dir").parent / "stage" / hashlib.sha256(url.encode()).hexdigest()[:16]


@contextmanager
def staged_upload(url: str, options: RemoteOptions) -> Iterator[Path]:
    """``with staged_upload(url, opts) as stage:`` the body writes a dataset into ``stage`` while it is uploaded to ``url``.

    The last upload follows the body's end; a body that raises publishes nothing more
    (what was uploaded stays, and a rerun resumes from it).
    """
    loc = open_location(url, options)
    stage = stage_dir_for(url, options)
    _probe(loc)
    try:
        stage.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise UsageError(f"{stage}: the staging directory cannot be created (a part of its path is a file); give --stage-dir") from None
    check_destination(loc, stage)
    seed_from_remote(loc, stage)
    _log.info("staging %s in %s", url, stage)
    uploader = _Uploader(stage, loc, options.upload_interval_s)
    uploader.start()
    try:
        yield stage
    finally:
        uploader.stop()
    publish_dataset(stage, loc)


def _probe(loc: RemoteLocation) -> None:
    """Write and delete one empty temp object: the bucket exists and the credentials may write, before any capture."""
    key = f"{loc.root}/{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}-probe"
    try:
        with storage_errors(loc.url):
            if loc.is_local:
                loc.fs.makedirs(loc.root, exist_ok=True)
            loc.call("pipe_file", key, b"")
            loc.call("rm", key)
    except FileNotFoundError:
        raise RemoteError(f"{loc.url}: the bucket (or directory) does not exist; create it, or check the URL") from None


def check_destination(loc: RemoteLocation, stage: Path) -> None:
    """``loc`` holds nothing, or the dataset this build writes or resumes: anything else is refused before any capture."""
    local = Manifest.load(stage) if is_dataset_dir(stage) else None
    remote = loc.manifest()
    if remote is None:
        refuse_foreign(loc, None if local is None else local.dataset_id)
        return
    if local is not None and local.dataset_id != remote.dataset_id:
        raise ForeignDatasetError(
            f"{loc.url} already holds another dataset (dataset id {remote.dataset_id}, the staging directory {stage} holds "
            f"{local.dataset_id}); nothing was changed: write to a new prefix, or delete the staging directory to resume from the bucket"
        )


def seed_from_remote(loc: RemoteLocation, stage: Path) -> int:
    """A staging directory without a dataset gets what ``loc`` already holds; returns the shards downloaded."""
    if is_dataset_dir(stage):
        return 0
    got = loc.manifest_and_bytes()
    if got is None:
        return 0
    remote, data = got
    names = [(record.file, Expected(record.bytes, record.hash_algorithm, record.digest)) for record in remote.shards]
    norm = remote.metadata.final_norm
    if norm is not None and norm.weight_file is not None:
        size = loc.size(norm.weight_file)
        if size is not None and size > MAX_NORM_WEIGHT_BYTES:
            raise RemoteError(
                f"{loc.url}/{norm.weight_file}: {size} bytes is no norm weight (over {MAX_NORM_WEIGHT_BYTES}; replaced object?)"
            )
        if size is not None:
            names.append((norm.weight_file, Expected(size, "sha256", norm.weight_sha256)))
    for name, expected in names:
        dest = resolve_member(stage, name, what="remote member")
        dest.parent.mkdir(parents=True, exist_ok=True)
        download_file(loc, name, dest, expected)
    atomic_write_bytes(stage / MANIFEST_NAME, data)  # last, as everywhere: the shards it lists are in place
    _log.info("resumed %s from the bucket: %d shard(s) downloaded into %s", loc.url, len(remote.shards), stage)
    return len(remote.shards)


class _Uploader:
    """Publishes the staging directory every ``interval`` seconds while the build runs; errors wait for :meth:`stop`."""

    def __init__(self, stage: Path, loc: RemoteLocation, interval: float) -> None:
        self.stage, self.loc, self.interval = stage, loc, interval
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="hs-upload", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if not os.path.exists(self.stage / MANIFEST_NAME):
                continue
            try:
                publish_dataset(self.stage, self.loc)
            except BaseException as exc:  # noqa: BLE001 -- raised by stop(), on the build's thread
                self._error = exc
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self._error is not None:
            raise self._error

"""``build --out URL``: the writer fills a local staging directory; shards are uploaded as they publish.

The local writer stays what it is (disk speed, atomic, resumable). An uploader thread
publishes the staging directory to the URL every ``upload_interval_s`` (shards first,
the manifest last: :mod:`.publish`), and once more when the build ends, so a trainer
following the URL sees shards while the build runs. A rank rerun after a kill resumes
in its staging directory; one whose staging directory was lost (a new node) first
downloads what the URL already holds into a fresh one (hash-checked), so it neither
captures those samples again nor loses them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from hs_dataset.config.remote import RemoteOptions
from hs_dataset.formats.atomic import atomic_write_bytes
from hs_dataset.formats.manifest import MANIFEST_NAME, is_dataset_dir
from hs_dataset.formats.paths import resolve_member
from hs_dataset.remote.location import RemoteLocation, open_location
from hs_dataset.remote.publish import publish_dataset
from hs_dataset.remote.transfer import Expected, download_file

__all__ = ["stage_dir_for", "staged_upload", "seed_from_remote"]

_log = logging.getLogger("hs_dataset.remote")


def stage_dir_for(url: str, options: RemoteOptions) -> Path:
    """The staging directory of ``url``: the one configured, else one per URL beside the cache."""
    if options.stage_dir is not None:
        return options.stage_dir
    return options.cache_dir.parent / "stage" / hashlib.sha256(url.encode()).hexdigest()[:16]


@contextmanager
def staged_upload(url: str, options: RemoteOptions) -> Iterator[Path]:
    """``with staged_upload(url, opts) as stage:`` the body writes a dataset into ``stage`` while it is uploaded to ``url``.

    The last upload follows the body's end; a body that raises publishes nothing more
    (what was uploaded stays, and a rerun resumes from it).
    """
    loc = open_location(url, options.storage_options)
    stage = stage_dir_for(url, options)
    stage.mkdir(parents=True, exist_ok=True)
    seed_from_remote(loc, stage)
    _log.info("staging %s in %s", url, stage)
    uploader = _Uploader(stage, loc, options.upload_interval_s)
    uploader.start()
    try:
        yield stage
    finally:
        uploader.stop()
    publish_dataset(stage, loc)


def seed_from_remote(loc: RemoteLocation, stage: Path) -> int:
    """A staging directory without a dataset gets what ``loc`` already holds; returns the shards downloaded."""
    if is_dataset_dir(stage):
        return 0
    remote = loc.manifest()
    if remote is None:
        return 0
    names = [(record.file, Expected(record.bytes, record.hash_algorithm, record.digest)) for record in remote.shards]
    norm = remote.metadata.get("final_norm") or {}
    if "weight_file" in norm:
        size = loc.size(str(norm["weight_file"]))
        if size is not None:
            names.append((str(norm["weight_file"]), Expected(size, "sha256", norm.get("weight_sha256"))))
    for name, expected in names:
        dest = resolve_member(stage, name, what="remote member")
        dest.parent.mkdir(parents=True, exist_ok=True)
        download_file(loc, name, dest, expected)
    data = loc.read_bytes(MANIFEST_NAME, 1 << 28)
    atomic_write_bytes(stage / MANIFEST_NAME, data or b"")  # last, as everywhere: the shards it lists are in place
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

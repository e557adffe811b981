"""Follow datasets that are still being built: every sample there now, then those of shards published later.

A trainer on another node than the capture reads what the ranks have uploaded and picks
up each new shard as its rank publishes it (``build --out URL`` uploads every
``upload_interval_s``). Shards are listed by a remote manifest only once uploaded and
checked, and the manifest is written last, so a follower never reads a half-published
shard; each shard is read once, through the bounded cache, hash-checked on download.

URLs are compared as the storage names them (``s3://b/p/`` is ``s3://b/p``): one
listed twice is followed once. A shard is known by its recorded hash, and a prefix is
known by its dataset id and the shards it listed: a prefix deleted and rebuilt (a new
dataset id, or other bytes under a shard name already read) would yield its samples a
second time, so it ends the follow with a :class:`RebuiltDatasetError` naming the URL;
the caller restarts (a new ``follow_dataset``) to read the rebuilt data from its start.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hs_dataset.config.remote import FollowSettings, RemoteOptions
from hs_dataset.config.run import parse_options
from hs_dataset.errors import ForeignDatasetError, RebuiltDatasetError, UsageError
from hs_dataset.formats.hashing import HASH_ALGORITHMS
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest, ShardRecord
from hs_dataset.formats.paths import check_local_path
from hs_dataset.remote.cache import ShardCache
from hs_dataset.remote.dataset import RemoteDataset
from hs_dataset.remote.location import is_url, open_location

__all__ = ["follow_dataset"]


def follow_dataset(
    urls: str | list[str],
    *,
    poll_s: float = 5.0,
    idle_timeout_s: float | None = None,
    stop: Callable[[], bool] | None = None,
    **options: Any,
) -> Iterator[dict[str, Any]]:
    """Yield the samples (reader dicts) of every shard the datasets at ``urls`` list, now and as they grow.

    Ends when no new shard appeared for ``idle_timeout_s`` seconds (None: never), or
    when ``stop()`` returns True between polls. A URL with no manifest yet is waited for.
    ``options``: :class:`~hs_dataset.config.remote.RemoteOptions` (cache_dir,
    max_cache_bytes, prefetch_shards, storage_options, request_timeout_s, ...). Every
    argument is checked here, before the first sample: a bad one is a UsageError.
    """
    settings = parse_options(RemoteOptions, "follow_dataset()", options)
    parse_options(FollowSettings, "follow_dataset()", {"poll_s": poll_s, "idle_timeout_s": idle_timeout_s})
    pending = [urls] if isinstance(urls, str) else urls
    if not isinstance(pending, (list, tuple)) or not pending:
        raise UsageError(f"follow_dataset(): urls must be a URL or a non-empty list of URLs, got {str(urls)[:80]!r}")
    bad = [u for u in pending if not isinstance(u, str) or not is_url(u)]
    if bad:
        raise UsageError(
            f"follow_dataset(): {str(bad[0])[:120]!r} is no URL (s3://bucket/prefix, ...); a local dataset is read with open_dataset"
        )
    if stop is not None and not callable(stop):
        raise UsageError(f"follow_dataset(): stop must be a callable returning True to end, got {type(stop).__name__}")
    check_local_path(settings.cache_dir, what="cache_dir")
    distinct = _distinct_urls(pending, settings)
    ShardCache(
        settings.cache_dir, settings.max_cache_bytes
    )  # a cache_dir that cannot be written is its one line here, not at a first sample
    return _follow(distinct, float(poll_s), idle_timeout_s, stop, settings)


def _distinct_urls(urls: list[str] | tuple[str, ...], settings: RemoteOptions) -> list[str]:
    """Each prefix once, in the order given: ``s3://b/p`` and ``s3://b/p/`` (or ``s3://b//p``) name one dataset.

    Why: two spellings of one prefix were followed as two datasets and yielded every
    sample twice. Prefixes are compared as the storage resolves them; an unknown scheme
    or a bucket root is refused here, before the first sample.
    """
    seen: dict[str, str] = {}
    for url in urls:
        location = open_location(url, settings)
        seen.setdefault(location.fs.unstrip_protocol(location.root), location.url)
    return list(seen.values())


@dataclass
class _Followed:
    """What a follower has read of one prefix: the dataset id it held and the shards read, by name."""

    url: str
    dataset_id: str | None = None
    shards: dict[str, ShardRecord] = field(default_factory=dict)

    def check_not_rebuilt(self, manifest: Manifest) -> None:
        """Refuse a manifest of a rebuilt prefix: another dataset id, or other bytes under a shard name already read."""
        if self.dataset_id is not None and manifest.dataset_id != self.dataset_id:
            raise RebuiltDatasetError(
                f"{self.url}/{MANIFEST_NAME}: dataset_id is now {manifest.dataset_id[:12]!r}, was {self.dataset_id[:12]!r}: "
                f"the prefix was rebuilt while followed and following on would yield its samples twice; {_RESTART}"
            )
        self.dataset_id = manifest.dataset_id
        for record in manifest.shards:
            before = self.shards.get(record.file)
            if before is not None and not _same_bytes(before, record):
                raise RebuiltDatasetError(
                    f"{self.url}/{MANIFEST_NAME}: shards[].file {record.file!r} now names other bytes than the shard already "
                    f"read: the prefix was rebuilt while followed and following on would yield its samples twice; {_RESTART}"
                )


_RESTART = "start a new follow_dataset() to read the rebuilt dataset from its start"


def _same_bytes(a: ShardRecord, b: ShardRecord) -> bool:
    """The two records name the same bytes: equal sizes and every hash both record equal (one at least)."""
    common = [name for name in HASH_ALGORITHMS if getattr(a, name) is not None and getattr(b, name) is not None]
    return a.bytes == b.bytes and bool(common) and all(getattr(a, n) == getattr(b, n) for n in common)


def _follow(
    pending: list[str],
    poll_s: float,
    idle_timeout_s: float | None,
    stop: Callable[[], bool] | None,
    settings: RemoteOptions,
) -> Iterator[dict[str, Any]]:
    followed = [_Followed(url) for url in pending]
    done: set[str] = set()  # content hashes read, over every URL: the same bytes are never yielded twice
    identity: dict[str, str] = {}
    last_new = time.monotonic()
    while True:
        found = False
        for prefix in followed:
            for sample in _new_samples(prefix, done, identity, settings):
                found = True
                yield sample
        if found:
            last_new = time.monotonic()
            continue
        if (stop is not None and stop()) or (idle_timeout_s is not None and time.monotonic() - last_new >= idle_timeout_s):
            return
        time.sleep(poll_s)


def _new_samples(prefix: _Followed, done: set[str], identity: dict[str, str], settings: RemoteOptions) -> Iterator[dict[str, Any]]:
    """The samples of shards the prefix's manifest lists whose hash ``done`` does not hold (then added), in manifest order."""
    url = prefix.url
    if open_location(url, settings).size(MANIFEST_NAME) is None:
        return
    data = RemoteDataset(url, options=settings)
    try:
        first = identity.setdefault("identity", data.manifest.identity)
        if data.manifest.identity != first:
            raise ForeignDatasetError(
                f"{url} holds another dataset than the other URLs followed (identity {data.manifest.identity[:12]}); follow one build"
            )
        prefix.check_not_rebuilt(data.manifest)
        for index, record in enumerate(data.manifest.shards):
            if record.content_hash in done:
                prefix.shards[record.file] = record
                continue
            reader = data.shard(index)
            for i in range(len(reader)):
                yield reader.sample(i)
            done.add(record.content_hash)
            prefix.shards[record.file] = record
    finally:
        data.close()

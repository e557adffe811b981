"""Follow datasets that are still being built: every sample there now, then those of shards published later.

A trainer on another node than the capture reads what the ranks have uploaded and picks
up each new shard as its rank publishes it (``build --out URL`` uploads every
``upload_interval_s``). Shards are listed by a remote manifest only once uploaded and
checked, and the manifest is written last, so a follower never reads a half-published
shard; each shard is read once, through the bounded cache, hash-checked on download.
A shard is known by its recorded hash, not its name: a prefix rebuilt under the same
shard names yields the new shards' samples.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from hs_dataset.config.remote import FollowSettings, RemoteOptions
from hs_dataset.config.run import parse_options
from hs_dataset.errors import ForeignDatasetError, UsageError
from hs_dataset.formats.manifest import MANIFEST_NAME
from hs_dataset.formats.paths import check_local_path
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
    for url in pending:
        open_location(url, settings)  # an unknown scheme or a bucket root is refused now
    return _follow(list(pending), float(poll_s), idle_timeout_s, stop, settings)


def _follow(
    pending: list[str],
    poll_s: float,
    idle_timeout_s: float | None,
    stop: Callable[[], bool] | None,
    settings: RemoteOptions,
) -> Iterator[dict[str, Any]]:
    done: dict[str, set[str]] = {url: set() for url in pending}
    identity: dict[str, str] = {}
    last_new = time.monotonic()
    while True:
        found = False
        for url in pending:
            for sample in _new_samples(url, done[url], identity, settings):
                found = True
                yield sample
        if found:
            last_new = time.monotonic()
            continue
        if (stop is not None and stop()) or (idle_timeout_s is not None and time.monotonic() - last_new >= idle_timeout_s):
            return
        time.sleep(poll_s)


def _new_samples(url: str, done: set[str], identity: dict[str, str], settings: RemoteOptions) -> Iterator[dict[str, Any]]:
    """The samples of shards ``url``'s manifest lists whose hash ``done`` does not hold (then added), in manifest order."""
    if open_location(url, settings).size(MANIFEST_NAME) is None:
        return
    data = RemoteDataset(url, options=settings)
    try:
        first = identity.setdefault("identity", data.manifest.identity)
        if data.manifest.identity != first:
            raise ForeignDatasetError(
                f"{url} holds another dataset than the other URLs followed (identity {data.manifest.identity[:12]}); follow one build"
            )
        for index, record in enumerate(data.manifest.shards):
            if record.content_hash in done:
                continue
            reader = data.shard(index)
            for i in range(len(reader)):
                yield reader.sample(i)
            done.add(record.content_hash)
    finally:
        data.close()

"""A dataset at a URL, read through the bounded local cache (:func:`hs_dataset.dataset_access.open_dataset` opens it).

:class:`RemoteDataset` is the reader's :class:`~hs_dataset.formats.reader.HiddenStateDataset`
over a manifest read from the store, whose shards come from the
:class:`~hs_dataset.remote.cache.ShardCache` (hash-checked on download, evicted least
recently used) with the next ones prefetched. It keeps only a few shards open (each
holds a shared lock that keeps the cache from evicting it), so a sequential read of a
dataset larger than the disk stays within the bound. It pickles as its URL and options,
so DataLoader workers open their own.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

import torch

from hs_dataset.config.remote import RemoteOptions
from hs_dataset.errors import UsageError
from hs_dataset.formats.manifest import ShardRecord
from hs_dataset.formats.paths import check_local_path, resolve_member
from hs_dataset.formats.reader import MAX_NORM_WEIGHT_BYTES, HiddenStateDataset, ShardReader
from hs_dataset.remote.cache import META_DIR, ShardCache
from hs_dataset.remote.header import read_offsets
from hs_dataset.remote.location import open_location
from hs_dataset.remote.prefetch import Prefetcher
from hs_dataset.remote.transfer import Expected

__all__ = ["OPEN_SHARDS", "RemoteDataset"]

OPEN_SHARDS = 2  # shards a reader keeps open (the one being read and the one before, for a reader at a boundary)


class RemoteDataset(HiddenStateDataset):
    """A dataset in object storage, read through a bounded local cache (see the module docstring)."""

    def __init__(self, url: str, *, verify_hashes: bool = False, options: RemoteOptions | None = None) -> None:
        self.url = url
        self.options = options or RemoteOptions()
        check_local_path(self.options.cache_dir, what="cache_dir")  # before the store is asked anything
        self.location = open_location(url, self.options)
        manifest = self.location.require_manifest()
        self.cache = ShardCache(self.options.cache_dir, self.options.max_cache_bytes)
        # the small files the manifest names besides shards: inside the cache (the dataset id is one plain name, no link on the way)
        side = resolve_member(
            self.cache.directory, f"{META_DIR}/{manifest.dataset_id}", what="side-file directory", where=str(self.cache.directory)
        )
        super().__init__(side, verify_hashes=verify_hashes, manifest=manifest)
        _check_bound(self.url, manifest.shards, self.options)
        self._prefetch = Prefetcher(self.cache, self.location, manifest.shards, self.options.prefetch_shards)
        self._pins: OrderedDict[int, int] = OrderedDict()
        self._offsets: dict[int, torch.Tensor] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "verify_hashes": self.verify_hashes, "options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], verify_hashes=state["verify_hashes"], options=state["options"])

    def _open_shard(self, index: int, record: ShardRecord) -> ShardReader:
        """The cached copy, pinned while open; the least recently opened beyond OPEN_SHARDS is let go."""
        while True:
            path = self._prefetch.get(index)
            try:
                fd = self.cache.open_pinned(path)
            except FileNotFoundError:
                continue  # evicted by another process between the fetch and the pin: fetch again
            if os.fstat(fd).st_nlink > 0:
                break
            os.close(fd)
        try:
            reader = ShardReader(path, manifest=self.manifest, record=record, verify_hash=self.verify_hashes)
        except BaseException:
            os.close(fd)
            raise
        self._pins[index] = fd
        while len(self._pins) > OPEN_SHARDS:
            old, old_fd = self._pins.popitem(last=False)
            self._readers.pop(old, None)  # its views stay valid (the mapping keeps the file) until dropped
            os.close(old_fd)
        self._prefetch.ahead(index)  # after the old pins went: the room for what comes next is theirs, not the next shard's
        return reader

    def shard_offsets(self, index: int) -> torch.Tensor:
        """Read from the store with two ranged reads (header, then the offsets), not by downloading the shard."""
        offsets = self._offsets.get(index)
        if offsets is None:
            offsets = read_offsets(self.location, self.manifest.shards[index])
            self._offsets[index] = offsets
        return offsets

    def final_norm(self) -> tuple[torch.Tensor, float]:
        info = self.manifest.metadata.final_norm
        if info is not None and info.weight_file is not None:
            self._fetch_side_file(info.weight_file, info.weight_sha256)
        return super().final_norm()

    def _fetch_side_file(self, name: str, sha256: str | None) -> None:
        """Download a small member the manifest names (the norm weight) into the meta directory, its hash checked before it is placed.

        A copy there is reused only when a hash is recorded (the reader checks it); else it is downloaded again.
        """
        dest = resolve_member(self.root, name, what="metadata.final_norm.weight_file")
        if sha256 is not None and dest.is_file():
            return
        size = self.location.size(name)
        if size is None:
            raise FileNotFoundError(f"{self.url}/{name}: the final-norm weight the manifest names is missing from the store")
        if size > MAX_NORM_WEIGHT_BYTES:
            raise UsageError(f"{self.url}/{name}: {size} bytes is no norm weight (replaced object?)")
        self.cache.fetch_side_file(self.location, name, dest, Expected(size, "sha256" if sha256 else None, sha256))

    def close(self) -> None:
        """Stop prefetching and let go of every open shard (the dataset can be read again after)."""
        self._prefetch.close()
        self._readers.clear()
        while self._pins:
            os.close(self._pins.popitem()[1])

    def __del__(self, _close=os.close) -> None:  # os may be gone at interpreter exit: keep a reference
        for fd in getattr(self, "_pins", {}).values():
            try:
                _close(fd)
            except OSError:
                pass


def _check_bound(url: str, shards: list[ShardRecord], options: RemoteOptions) -> None:
    """The bound must hold the shards a reader keeps open plus those prefetched; say the least that works."""
    largest = max((record.bytes for record in shards), default=0)
    need = (OPEN_SHARDS + options.prefetch_shards) * largest
    if need > options.max_cache_bytes:
        raise UsageError(
            f"{url}: max_cache_bytes {options.max_cache_bytes} cannot hold {OPEN_SHARDS} open + {options.prefetch_shards} "
            f"prefetched shards of up to {largest} bytes; give at least {need} (HS_DATASET_CACHE_BYTES) or fewer prefetch_shards"
        )

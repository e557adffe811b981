"""Online capture straight into training: a torch ``IterableDataset`` over a live SGLang server.

::

    import hs_dataset
    ds = hs_dataset.stream("tiny-deepseek-sglang", "chats.jsonl", server="http://127.0.0.1:30000",
                           cache_dir="cache/", max_cache_bytes=64 * 2**30)
    for epoch in range(3):
        for item in ds: ...           # Eagle3Dataset items (training.shift_sample), as the trainer asks
        print(ds.stats.summary())     # samples/s, tokens/s, cache hit rate, requests

Each epoch walks the source's samples exactly as ``build_dataset`` forms them (one
``CaptureSession``, ``pipeline/session.py``). A sample already in the cache is read from it; the
others are captured from the server with many requests in flight (``capture_stream``),
yielded, and written to the cache (``streaming/cache.py``), a normal dataset directory
(``ShardWriter``: verified shards, atomic manifest) that ``open_dataset`` and
``hs-dataset verify`` read.

The cache never holds more than ``max_cache_bytes`` on disk (every file counted,
including the room for the manifest's atomic rewrite). To make room for a new shard,
the oldest complete shards are evicted (``formats/evict.py``: out of the manifest
atomically, then deleted), oldest first among those whose samples this epoch has
already yielded. When every cached shard still holds a sample the epoch has not read
yet, the new samples are yielded without being cached: evicting a sample about to be
read would only make the epoch capture it again (with a cache smaller than the data,
cyclic epochs would otherwise hit nothing). Within a window of the source, cached
samples are yielded before the window's captures, so a sample in the cache when the
window starts is never captured again. A bound larger than the data keeps everything:
the next epoch sends no request.

Crashes: a killed stream loses only the captured samples not yet written to a shard;
restarted on the same ``cache_dir`` it yields the cached samples from the cache and
captures the rest. A server that dies mid-epoch is retried by the backend; a sample it
still cannot capture ends the epoch with one :class:`~hs_dataset.errors.CaptureError`
(``on_failure="skip"`` counts it and goes on) after the pending samples are written, so
what was cached stays valid.

One stream per cache directory: the epoch holds the directory's ``.lock``
(``formats/dirlock.py``), handing it to the ``ShardWriter`` while a shard is written.
Iterate in the main process (``DataLoader(num_workers=0)``): the capture is already
concurrent.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from hs_dataset.capture.base import CaptureBackend, CaptureFailure
from hs_dataset.config import Card, list_cards
from hs_dataset.config.run import StreamOptions, parse_options
from hs_dataset.errors import CaptureError, ForeignDatasetError, IntegrityError, UsageError
from hs_dataset.formats.encoding import all_finite
from hs_dataset.formats.manifest import Manifest
from hs_dataset.formats.paths import check_local_path
from hs_dataset.pipeline.session import CaptureSession, as_card
from hs_dataset.sample import CapturedSample, TokenizedSample
from hs_dataset.streaming.cache import MANIFEST_ENTRY_BYTES, StreamCache, Where, disk_bytes
from hs_dataset.streaming.stats import StreamStats
from hs_dataset.training import shift_sample

__all__ = ["StreamDataset", "stream"]

logger = logging.getLogger("hs_dataset.streaming.stream")

_WINDOW_PER_REQUEST = 16  # source samples looked at per request in flight before a window's misses are captured


def stream(
    card_or_model: Card | str | os.PathLike,
    source: Any = None,
    *,
    server: str | list[str] | None = None,
    cache_dir: str | os.PathLike,
    max_cache_bytes: int,
    backend: CaptureBackend | None = None,
    **options: Any,
) -> StreamDataset:
    """A torch ``IterableDataset`` of EAGLE-3 training items captured on demand (see the module doc).

    ``card_or_model``: a :class:`Card`, a shipped card name or ``.yaml`` path, or a model
    directory (the card is then derived from it, sglang backend). ``source``: what
    ``build_dataset`` takes (default: the card's source). ``server``: one URL or a list
    (default: the card's). Other options: :class:`~hs_dataset.config.run.StreamOptions`.
    ``backend``: an already built capture backend (tests); the stream then does not close it.
    """
    servers = [server] if isinstance(server, str) else (list(server) if server else None)
    values = {"source": source, "cache_dir": cache_dir, "max_cache_bytes": max_cache_bytes, "servers": servers, **options}
    opts = parse_options(StreamOptions, "stream()", values)
    card = _resolve_card(card_or_model, opts.servers)
    return StreamDataset(card, opts, backend=backend)


def _resolve_card(card_or_model: Card | str | os.PathLike, servers: list[str] | None) -> Card:
    """A card as given, by name or path, or derived from a model directory (sglang backend)."""
    text = str(card_or_model)
    if isinstance(card_or_model, Card) or text in list_cards() or text.endswith((".yaml", ".yml")):
        return as_card(card_or_model)
    from hs_dataset.model.card_from_model import card_from_model

    return card_from_model(text, backend="sglang", servers=servers)


@dataclass
class _Pending:
    """Captured samples yielded but not written yet, and the bytes their shard will take."""

    samples: list[CapturedSample] = field(default_factory=list)
    bytes: int = 0


class StreamDataset(torch.utils.data.IterableDataset):
    """The stream (see the module doc). ``stats``: the epoch running or last run; ``history``: every epoch."""

    def __init__(self, card: Card, options: StreamOptions, *, backend: CaptureBackend | None = None) -> None:
        super().__init__()
        self.options = options
        self.root = check_local_path(options.cache_dir, what="stream cache_dir")  # before the model loads
        self.max_cache_bytes = options.max_cache_bytes
        if card.regenerate.enabled:
            raise UsageError(
                f"config {card.name!r} has regenerate.enabled: stream() captures the source as written; use build_dataset for regeneration"
            )
        if options.shard_bytes is not None and options.shard_bytes * 2 > options.max_cache_bytes:
            raise UsageError(
                f"shard_bytes={options.shard_bytes} must be at most half of max_cache_bytes={options.max_cache_bytes}, or no shard could ever be evicted for the next"
            )
        self.session = CaptureSession(card, options, backend=backend)
        try:
            self.card = card = self.session.card
            self.metadata = self.session.metadata
            self.shard_bytes = options.shard_bytes or max(1, min(card.shards.bytes, self.max_cache_bytes // 8))
            self.batch_size = card.backend.batch_size
            self._in_flight = self.backend.in_flight(self.batch_size)
            self.history: list[StreamStats] = []
            self.stats = StreamStats(epoch=0)
            info = self.session.info
            self.cache = StreamCache(
                self.root,
                self.max_cache_bytes,
                self.metadata,
                final_norm_weight=info.final_norm_weight,
                storage=card.shards.storage,
                dtype=info.dtype,
                card_name=card.name,
            )
            self.stats.count_evicted(self.cache.open())
        except BaseException:
            self.close()
            raise

    @property
    def backend(self) -> CaptureBackend | None:
        return self.session.backend

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 1:
            raise UsageError(
                "hs_dataset.stream(): iterate it with DataLoader(num_workers=0) (or 1): every worker would capture the whole "
                "source again; the capture is already concurrent (batch_size requests in flight)"
            )
        return self._epoch()

    def _epoch(self) -> Iterator[dict[str, Any]]:
        self.stats = StreamStats(epoch=len(self.history) + 1)
        self.history.append(self.stats)
        started = time.perf_counter()
        requests0 = _requests(self.backend)
        self.cache.lock()
        pending = _Pending()
        consumed: set[str] = set()
        quarantined: set[str] = set()
        finished = False
        try:
            manifest, index = self.cache.index()
            self.stats.damaged_shards.extend(self.cache.take_damaged())
            self.stats.cached_at_start = len(index)
            quarantined = {q["sample_id"] for q in manifest.quarantine}
            misses: list[TokenizedSample] = []
            window = _WINDOW_PER_REQUEST * self._in_flight
            for sample in self.session.samples(self.session.open_rows()):
                sid = sample.sample_id
                if sid in quarantined:
                    self.stats.quarantined += 1
                    continue
                where = index.get(sid)
                if where is not None:
                    yield self._hit(sample, where, consumed)
                    continue
                misses.append(sample)
                if len(misses) >= window:
                    yield from self._capture(misses, pending, consumed, index)
                    misses = []
            yield from self._capture(misses, pending, consumed, index)
            self._flush(pending, consumed, index)
            finished = True
        finally:
            try:
                if not finished and pending.samples:
                    self._flush(pending, consumed, index)  # an early stop or a capture error keeps what was captured
            except Exception as exc:  # the error being raised (if any) is the one to report
                logger.warning("stream: could not write %d captured samples to %s: %s", len(pending.samples), self.root, exc)
            finally:
                self.cache.unlock()
                self._finish_stats(started, requests0)
                logger.info(self.stats.summary())

    def _hit(self, sample: TokenizedSample, where: Where, consumed: set[str]) -> dict[str, Any]:
        stored = self.cache.read(where)
        if not torch.equal(stored["input_ids"], sample.input_ids):
            raise ForeignDatasetError(
                f"{self.root / where[0]}: cached sample {sample.sample_id!r} holds other tokens than the source gives now "
                "(the source or its tokenizer changed under the same ids); pass another cache_dir, or delete this one"
            )
        if not (all_finite(stored["aux_hidden_states"]) and all_finite(stored["final_hidden_state"])):
            raise IntegrityError(
                f"{self.root / where[0]}: cached sample {sample.sample_id!r} holds NaN/inf states under a matching hash "
                "(the shard and its manifest entry were rewritten); run hs-dataset verify on it, or delete this cache_dir"
            )
        consumed.add(sample.sample_id)
        self.stats.hits += 1
        return self._yielded(stored)

    def _yielded(self, stored: dict[str, Any]) -> dict[str, Any]:
        self.stats.samples += 1
        self.stats.tokens += int(stored["input_ids"].shape[0])
        return shift_sample(stored, final_alignment=self.options.final_alignment)

    def _capture(
        self, misses: list[TokenizedSample], pending: _Pending, consumed: set[str], index: dict[str, Where]
    ) -> Iterator[dict[str, Any]]:
        """Capture ``misses`` with many requests in flight; yield each, and cache it shard by shard."""
        if not misses:
            return
        for result in self.backend.capture_stream(misses, self.batch_size):
            if isinstance(result, CaptureFailure):
                self._failed(result, pending, consumed, index)
                continue
            self.stats.captured += 1
            self.stats.captured_tokens += result.num_tokens
            need = self.cache.room_for(result)
            if not (all_finite(result.aux_hidden_states) and all_finite(result.final_hidden_state)):
                self.stats.quarantined += 1  # the writer records why in the manifest; never trained on
            else:
                consumed.add(result.sample_id)
                yield self._yielded(self.cache.as_stored(result))
            pending.samples.append(result)
            pending.bytes += need
            if pending.bytes >= self.shard_bytes:
                self._flush(pending, consumed, index)

    def _failed(self, failure: CaptureFailure, pending: _Pending, consumed: set[str], index: dict[str, Where]) -> None:
        self.stats.failed += 1
        self.stats.failures.append({"sample_id": failure.sample_id, "reason": failure.reason})
        if self.options.on_failure == "skip":
            return
        self._flush(pending, consumed, index)
        raise CaptureError(
            f"stream: sample {failure.sample_id!r} could not be captured ({failure.reason}); the {self.cache.cached_samples()} samples cached in "
            f"{self.root} stay valid: fix the server and iterate again to resume (or pass on_failure='skip')"
        )

    def _flush(self, pending: _Pending, consumed: set[str], index: dict[str, Where]) -> None:
        """Write the pending samples as one shard if room can be made; otherwise they stay uncached."""
        if not pending.samples:
            return
        samples, need = pending.samples, pending.bytes + MANIFEST_ENTRY_BYTES
        pending.samples, pending.bytes = [], 0
        removed = self.cache.make_room(need, consumed=consumed)
        if removed is None:
            self.stats.uncached += sum(1 for s in samples if s.sample_id in consumed)
            return
        self.stats.count_evicted(removed)
        self.cache.write(samples)
        _manifest, fresh = self.cache.index()
        self.stats.damaged_shards.extend(self.cache.take_damaged())
        index.clear()
        index.update(fresh)

    def _finish_stats(self, started: float, requests0: int) -> None:
        self.stats.elapsed_s = time.perf_counter() - started
        self.stats.requests = _requests(self.backend) - requests0
        self.stats.cache_bytes = disk_bytes(self.root)
        try:
            self.stats.cache_samples = Manifest.load(self.root).num_samples
        except Exception:
            self.stats.cache_samples = 0

    def close(self) -> None:
        """Release the cache and close the backend the stream made (a backend passed in is the caller's)."""
        cache = getattr(self, "cache", None)
        if cache is not None:
            cache.unlock()
        session = getattr(self, "session", None)
        if session is not None:
            session.close()

    def __enter__(self) -> StreamDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _requests(backend: CaptureBackend | None) -> int:
    stats = getattr(backend, "stats", None)
    return int(stats.get("requests", 0)) if isinstance(stats, dict) else 0

"""Online capture straight into training: a torch ``IterableDataset`` over a live SGLang server.

::

    import hs_dataset
    ds = hs_dataset.stream("tiny-deepseek-sglang", "chats.jsonl", server="http://127.0.0.1:30000",
                           cache_dir="cache/", max_cache_bytes=64 * 2**30)
    for epoch in range(3):
        for item in ds: ...           # Eagle3Dataset items (training.shift_sample), as the trainer asks
        print(ds.stats.summary())     # samples/s, tokens/s, cache hit rate, requests

Each epoch walks the source (the pipeline's source stage). A sample already in the cache
is read from it; the others are captured from the server with many requests in flight
(``capture_stream``), yielded, and written to the cache, a normal dataset directory
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

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hs_dataset.capture.base import CaptureBackend, CaptureFailure
from hs_dataset.config import Card, list_cards, load_card
from hs_dataset.errors import CaptureError, ForeignDatasetError, UsageError
from hs_dataset.formats.dirlock import acquire_dir_lock, release_dir_lock
from hs_dataset.formats.encoding import all_finite, decode_state, encode_state, get_encoding, state_encoding_for
from hs_dataset.formats.evict import evict_shards
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest, identity_fingerprint, is_dataset_dir
from hs_dataset.formats.paths import resolve_member
from hs_dataset.formats.reader import ShardReader
from hs_dataset.formats.shard_layout import MAX_SHARD_BYTES, SHARD_NAME_RE
from hs_dataset.formats.writer import ShardWriter
from hs_dataset.build import limit_samples, load_card_tokenizer, open_rows, resolve_source, tokenizer_info, dataset_metadata, make_backend
from hs_dataset.sample import CapturedSample, TokenizedSample
from hs_dataset.training import shift_sample

__all__ = ["stream", "StreamDataset", "StreamOptions", "StreamStats"]

logger = logging.getLogger("hs_dataset.streaming.stream")

_HEADER_BYTES = 2048  # a shard header's fixed part (tensor table, metadata, padding); sample ids are added per sample
_MANIFEST_ENTRY_BYTES = 512  # one more shards[] entry in manifest.json
_WINDOW_PER_REQUEST = 16  # source samples looked at per request in flight before a window's misses are captured


class StreamOptions(BaseModel):
    """What :func:`stream` takes besides the card and the source (validated; unknown keys refused)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cache_dir: Path = Field(description="The cache: a dataset directory (created, or resumed if it holds this card's data).")
    max_cache_bytes: int = Field(gt=0, description="Bytes the cache directory may hold on disk, every file counted.")
    servers: list[str] | None = Field(None, description="SGLang server URLs; default: the card's backend.urls.")
    batch_size: int | None = Field(None, gt=0, description="Requests in flight (as build's --batch-size); default: the card's backend.concurrency.")
    num_samples: int | None = Field(None, ge=0, description="Use only the first N samples of the source.")
    shard_bytes: int | None = Field(None, gt=0, le=MAX_SHARD_BYTES, description="Cache shard size; default min(card, max_cache_bytes / 8).")
    final_alignment: Literal["next", "current"] = Field("next", description="As training.shift_sample.")
    on_failure: Literal["raise", "skip"] = Field("raise", description="A sample the server cannot capture: one CaptureError, or counted and skipped.")
    model_path: str | None = Field(None, description="Local snapshot of the served model; default: the card's model.path.")


@dataclass
class StreamStats:
    """One epoch of a stream: what was read, captured, kept and evicted, and how fast."""

    epoch: int
    samples: int = 0  # items yielded
    tokens: int = 0  # stored tokens of the yielded samples
    hits: int = 0  # read from the cache
    captured: int = 0  # captured from the server this epoch
    captured_tokens: int = 0
    uncached: int = 0  # captured and yielded but not kept (no shard could be evicted for them)
    failed: int = 0  # samples the server could not capture (on_failure="skip")
    quarantined: int = 0  # NaN/inf states: recorded in the manifest's quarantine, never yielded
    requests: int = 0  # HTTP requests the backend sent (retries and probes included)
    evicted_shards: int = 0
    evicted_samples: int = 0
    cached_at_start: int = 0  # samples in the cache when the epoch began
    cache_bytes: int = 0  # on disk at the end of the epoch
    cache_samples: int = 0
    elapsed_s: float = 0.0
    failures: list[dict[str, str]] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        looked_up = self.hits + self.captured
        return self.hits / looked_up if looked_up else 0.0

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "hit_rate": round(self.hit_rate, 4), "samples_per_s": round(self.samples_per_s, 3), "tokens_per_s": round(self.tokens_per_s, 1)}

    def summary(self) -> str:
        return (
            f"stream epoch {self.epoch}: {self.samples} samples ({self.tokens} tokens) in {self.elapsed_s:.1f} s, "
            f"{self.samples_per_s:.2f} samples/s, {self.tokens_per_s:.0f} tokens/s; cache hit rate {self.hit_rate:.1%} "
            f"({self.hits} read, {self.captured} captured in {self.requests} requests, {self.uncached} not kept); "
            f"evicted {self.evicted_shards} shards ({self.evicted_samples} samples); failed {self.failed}, quarantined {self.quarantined}; "
            f"cache {self.cache_samples} samples, {self.cache_bytes} bytes"
        )


def stream(
    card_or_model: Card | str | os.PathLike,
    source: Any = None,
    *,
    server: str | list[str] | None = None,
    cache_dir: str | os.PathLike,
    max_cache_bytes: int,
    backend: CaptureBackend | None = None,
    **options: Any,
) -> "StreamDataset":
    """A torch ``IterableDataset`` of EAGLE-3 training items captured on demand (see the module doc).

    ``card_or_model``: a :class:`Card`, a shipped card name or ``.yaml`` path, or a model
    directory (the card is then derived from it, sglang backend). ``source``: what
    ``build_dataset`` takes (default: the card's source). ``server``: one URL or a list
    (default: the card's). Other options: :class:`StreamOptions`. ``backend``: an
    already built capture backend (tests); the stream then does not close it.
    """
    servers = [server] if isinstance(server, str) else (list(server) if server else None)
    try:
        opts = StreamOptions(cache_dir=Path(cache_dir), max_cache_bytes=max_cache_bytes, servers=servers, **options)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = ".".join(str(p) for p in err["loc"]) or "options"
        raise UsageError(f"stream(): {name}: {err['msg']} (got {str(err.get('input'))[:80]}); see hs_dataset.streaming.stream.StreamOptions") from None
    card = _resolve_card(card_or_model, opts.servers)
    return StreamDataset(card, source, opts, backend=backend)


def _resolve_card(card_or_model: Card | str | os.PathLike, servers: list[str] | None) -> Card:
    """A card as given, by name or path, or derived from a model directory (sglang backend)."""
    if isinstance(card_or_model, Card):
        return card_or_model
    text = str(card_or_model)
    if text in list_cards() or text.endswith((".yaml", ".yml")):
        return load_card(text)
    from hs_dataset.model.card_from_model import card_from_model

    return card_from_model(text, backend="sglang", servers=servers)


@dataclass
class _Pending:
    """Captured samples yielded but not written yet, and the bytes their shard will take."""

    samples: list[CapturedSample] = field(default_factory=list)
    bytes: int = 0


class StreamDataset(torch.utils.data.IterableDataset):
    """The stream (see the module doc). ``stats``: the epoch running or last run; ``history``: every epoch."""

    def __init__(self, card: Card, source: Any, options: StreamOptions, *, backend: CaptureBackend | None = None) -> None:
        super().__init__()
        self.card, self.options = card, options
        self.root = options.cache_dir
        self.max_cache_bytes = options.max_cache_bytes
        if card.regenerate.enabled:
            raise UsageError(f"config {card.name!r} has regenerate.enabled: stream() captures the source as written; use build_dataset for regeneration")
        if options.shard_bytes is not None and options.shard_bytes * 2 > options.max_cache_bytes:
            raise UsageError(f"shard_bytes={options.shard_bytes} must be at most half of max_cache_bytes={options.max_cache_bytes}, or no shard could ever be evicted for the next")
        self._source = resolve_source(card, source)
        self._lock_fd: int | None = None
        self._shards: dict[str, tuple[str, ShardReader]] = {}  # file -> (its recorded hash, reader)
        self._own_backend = backend is None
        self.backend = backend or make_backend(card, model_path=options.model_path, servers=options.servers, batch_size=options.batch_size)
        try:
            self._info = self.backend.info()
            tokenizer_dir = Path(self._info.model_path)
            self._tokenizer = load_card_tokenizer(card, tokenizer_dir)
            self.metadata = dataset_metadata(card, self._info, tokenizer_info(self._tokenizer, tokenizer_dir))
            self._encoding = get_encoding(state_encoding_for(self._info.dtype, card.shards.storage))
            self.shard_bytes = options.shard_bytes or max(1, min(card.shards.bytes, self.max_cache_bytes // 8))
            self.batch_size = options.batch_size or card.backend.batch_size
            self._in_flight = max(self.batch_size, int(getattr(self.backend, "concurrency", self.batch_size)))
            self.history: list[StreamStats] = []
            self.stats = StreamStats(epoch=0)
            self._open_cache()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ the cache directory
    def _open_cache(self) -> None:
        """Refuse another dataset's directory, create or resume the cache, and bring it within the bound."""
        if is_dataset_dir(self.root):
            manifest = Manifest.load(self.root)
            if manifest.identity != identity_fingerprint(self.metadata):
                model = manifest.metadata.get("model") or {}
                raise ForeignDatasetError(
                    f"{self.root}: holds the states of config {manifest.metadata.get('config_name')!r} "
                    f"(model {model.get('id') or model.get('path')!r}, aux layers {manifest.metadata.get('aux_layer_ids')}), "
                    f"not of {self.card.name!r}; pass another cache_dir, or delete this one to reuse the name"
                )
        self._write([])  # creates the manifest and norm weight, or resumes (temp files removed, orphans adopted)
        self._lock()
        try:
            fits = self._make_room(0, consumed=None)  # a lowered bound, or shards a crash left behind
        finally:
            self._unlock()
        if not fits:
            fixed = _disk_bytes(self.root) - Manifest.load(self.root).num_bytes
            raise UsageError(
                f"max_cache_bytes={self.max_cache_bytes} is smaller than the cache's own files in {self.root} "
                f"({fixed} bytes: manifest and norm weight, plus {self._reserve()} kept free for the manifest's rewrite); "
                "raise max_cache_bytes to hold at least a few samples' states"
            )

    def _lock(self) -> None:
        self._lock_fd = acquire_dir_lock(self.root)

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            release_dir_lock(self._lock_fd)
            self._lock_fd = None

    def _reserve(self) -> int:
        """Room kept free so a manifest rewrite (temp copy beside the old one) stays within the bound."""
        try:
            size = (self.root / MANIFEST_NAME).stat().st_size
        except OSError:
            size = 0
        return size + 4096

    def _write(self, samples: list[CapturedSample]) -> None:
        """One ``ShardWriter`` session: ``samples`` become one shard (NaN/inf ones go to the manifest's quarantine)."""
        held = self._lock_fd is not None
        self._unlock()  # the writer takes the directory lock itself
        try:
            with ShardWriter(
                self.root, self.metadata, final_norm_weight=self._info.final_norm_weight, storage=self.card.shards.storage,
                shard_bytes=MAX_SHARD_BYTES, writer_threads=1,
            ) as writer:
                for sample in samples:
                    writer.add(sample)
        finally:
            if held:
                self._lock()

    def _index(self) -> tuple[Manifest, dict[str, tuple[str, int]]]:
        """The cache's manifest and where each cached sample lies (shard file, index in it)."""
        manifest = Manifest.load(self.root)
        index: dict[str, tuple[str, int]] = {}
        live: dict[str, tuple[str, ShardReader]] = {}
        for record in manifest.shards:
            known = self._shards.get(record.file)
            # a name comes back with other bytes when the newest shard was evicted: compare the recorded hash
            # (format-2 records hold BLAKE3 only, so sha256 would be None on both sides)
            if known is None or known[0] != record.content_hash:
                path = resolve_member(self.root, record.file, what="shards[].file")
                known = (record.content_hash, ShardReader(path, manifest=manifest, record=record))
            live[record.file] = known
            for i, sid in enumerate(known[1].sample_ids):
                index[sid] = (record.file, i)
        self._shards = live
        return manifest, index

    def _make_room(self, need: int, *, consumed: set[str] | None) -> bool:
        """Evict the oldest shards until ``need`` more bytes fit; only fully ``consumed`` shards (all when None).

        Returns False when that is not possible.
        """
        manifest = Manifest.load(self.root)
        order = sorted(manifest.shards, key=lambda r: _seq(r.file))
        victims: list[str] = []
        free = self.max_cache_bytes - _disk_bytes(self.root) - self._reserve()
        for record in order:
            if free >= need:
                break
            if consumed is not None and not all(sid in consumed for sid in self._shard_ids(record.file)):
                continue
            victims.append(record.file)
            free += record.bytes
        if free < need:
            return False
        if victims:
            removed = evict_shards(self.root, victims)
            for record in removed:
                self._shards.pop(record.file, None)
            self.stats.evicted_shards += len(removed)
            self.stats.evicted_samples += sum(r.samples for r in removed)
        return True

    def _shard_ids(self, file: str) -> list[str]:
        if file not in self._shards:
            self._index()
        known = self._shards.get(file)
        return list(known[1].sample_ids) if known is not None else []

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
        self._lock()
        pending = _Pending()
        consumed: set[str] = set()
        quarantined: set[str] = set()
        finished = False
        try:
            manifest, index = self._index()
            self.stats.cached_at_start = len(index)
            quarantined = {q["sample_id"] for q in manifest.quarantine}
            misses: list[TokenizedSample] = []
            window = _WINDOW_PER_REQUEST * self._in_flight
            for sample in self._samples():
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
                self._unlock()
                self._finish_stats(started, requests0)
                logger.info(self.stats.summary())

    def _samples(self) -> Iterator[TokenizedSample]:
        """The source's tokenized samples, exactly as ``build_dataset`` forms them."""
        from hs_dataset.sources import iter_samples

        rows = open_rows(self.card, self._source)
        samples = iter_samples(
            rows, self._tokenizer, max_length=self.card.max_length, overflow=self.card.overflow,
            vocab_size=self._info.vocab_size, columns=self.card.source.columns,
        )
        return limit_samples(samples, self.options.num_samples)

    def _hit(self, sample: TokenizedSample, where: tuple[str, int], consumed: set[str]) -> dict[str, Any]:
        file, i = where
        stored = self._shards[file][1].sample(i)
        if not torch.equal(stored["input_ids"], sample.input_ids):
            raise ForeignDatasetError(
                f"{self.root / file}: cached sample {sample.sample_id!r} holds other tokens than the source gives now "
                "(the source or its tokenizer changed under the same ids); pass another cache_dir, or delete this one"
            )
        consumed.add(sample.sample_id)
        self.stats.hits += 1
        return self._yielded(stored)

    def _yielded(self, stored: dict[str, Any]) -> dict[str, Any]:
        self.stats.samples += 1
        self.stats.tokens += int(stored["input_ids"].shape[0])
        return shift_sample(stored, final_alignment=self.options.final_alignment)

    def _capture(self, misses: list[TokenizedSample], pending: _Pending, consumed: set[str], index: dict) -> Iterator[dict[str, Any]]:
        """Capture ``misses`` with many requests in flight; yield each, and cache it shard by shard."""
        if not misses:
            return
        for result in self.backend.capture_stream(misses, self.batch_size):
            if isinstance(result, CaptureFailure):
                self._failed(result, pending, consumed, index)
                continue
            self.stats.captured += 1
            self.stats.captured_tokens += result.num_tokens
            need = self._shard_estimate([result])
            fixed = _disk_bytes(self.root) - Manifest.load(self.root).num_bytes
            if need + _MANIFEST_ENTRY_BYTES + fixed + self._reserve() > self.max_cache_bytes:
                raise UsageError(
                    f"max_cache_bytes={self.max_cache_bytes} cannot hold one sample: {result.sample_id!r} "
                    f"({result.num_tokens} tokens) takes {need} bytes in a shard, and the cache's own files {fixed + self._reserve()}; "
                    f"raise max_cache_bytes to at least {need + _MANIFEST_ENTRY_BYTES + fixed + self._reserve()}"
                )
            if not (all_finite(result.aux_hidden_states) and all_finite(result.final_hidden_state)):
                self.stats.quarantined += 1  # the writer records why in the manifest; never trained on
            else:
                consumed.add(result.sample_id)
                yield self._yielded(self._as_stored(result))
            pending.samples.append(result)
            pending.bytes += need
            if pending.bytes >= self.shard_bytes:
                self._flush(pending, consumed, index)

    def _failed(self, failure: CaptureFailure, pending: _Pending, consumed: set[str], index: dict) -> None:
        self.stats.failed += 1
        self.stats.failures.append({"sample_id": failure.sample_id, "reason": failure.reason})
        if self.options.on_failure == "skip":
            return
        self._flush(pending, consumed, index)
        cached = sum(r.samples for r in Manifest.load(self.root).shards)
        raise CaptureError(
            f"stream: sample {failure.sample_id!r} could not be captured ({failure.reason}); the {cached} samples cached in "
            f"{self.root} stay valid: fix the server and iterate again to resume (or pass on_failure='skip')"
        )

    def _as_stored(self, sample: CapturedSample) -> dict[str, Any]:
        """The sample as a later epoch reads it from the cache (fp8 storage: encoded and decoded once)."""
        aux, final = sample.aux_hidden_states, sample.final_hidden_state
        if self._encoding.scaled:
            aux = decode_state(*encode_state(aux, self._encoding), self._encoding)
            final = decode_state(*encode_state(final, self._encoding), self._encoding)
        return {"sample_id": sample.sample_id, "input_ids": sample.input_ids, "loss_mask": sample.loss_mask,
                "aux_hidden_states": aux, "final_hidden_state": final}

    def _shard_estimate(self, samples: Iterable[CapturedSample]) -> int:
        """An upper bound of the bytes these samples take in one shard (data, offsets, header with their ids)."""
        total = _HEADER_BYTES + 8
        item = self._encoding.storage_torch_dtype.itemsize
        for s in samples:
            t, k, h = s.aux_hidden_states.shape
            total += t * (8 + 1) + t * (k + 1) * h * item + 8 + len(json.dumps(s.sample_id)) + 2
            if self._encoding.scaled:
                total += t * (k + 1) * 4
        return total

    def _flush(self, pending: _Pending, consumed: set[str], index: dict) -> None:
        """Write the pending samples as one shard if room can be made; otherwise they stay uncached."""
        if not pending.samples:
            return
        samples, need = pending.samples, pending.bytes + _MANIFEST_ENTRY_BYTES
        pending.samples, pending.bytes = [], 0
        if not self._make_room(need, consumed=consumed):
            self.stats.uncached += sum(1 for s in samples if s.sample_id in consumed)
            return
        self._write(samples)
        _manifest, fresh = self._index()
        index.clear()
        index.update(fresh)

    def _finish_stats(self, started: float, requests0: int) -> None:
        self.stats.elapsed_s = time.perf_counter() - started
        self.stats.requests = _requests(self.backend) - requests0
        self.stats.cache_bytes = _disk_bytes(self.root)
        try:
            self.stats.cache_samples = Manifest.load(self.root).num_samples
        except Exception:
            self.stats.cache_samples = 0

    def close(self) -> None:
        """Close the backend the stream made (a backend passed in is the caller's)."""
        if getattr(self, "_lock_fd", None) is not None:
            self._unlock()
        backend = getattr(self, "backend", None)
        if self._own_backend and backend is not None:
            backend.close()
            self.backend = None  # type: ignore[assignment]

    def __enter__(self) -> "StreamDataset":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _disk_bytes(root: Path) -> int:
    """Bytes of every regular file under ``root`` (what the cache bound counts)."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                pass
    return total


def _seq(file: str) -> int:
    match = SHARD_NAME_RE.match(Path(file).name)
    return int(match.group("seq")) if match else -1


def _requests(backend: CaptureBackend | None) -> int:
    stats = getattr(backend, "stats", None)
    return int(stats.get("requests", 0)) if isinstance(stats, dict) else 0

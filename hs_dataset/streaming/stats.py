"""What one epoch of a stream did: read, captured, kept and evicted, and how fast."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from hs_dataset.formats.manifest import ShardRecord

__all__ = ["StreamStats"]


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
    damaged_shards: list[dict[str, str]] = field(default_factory=list)  # failed the hash check: evicted, captured again

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

    def count_evicted(self, removed: Iterable[ShardRecord]) -> None:
        removed = list(removed)
        self.evicted_shards += len(removed)
        self.evicted_samples += sum(r.samples for r in removed)

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "hit_rate": round(self.hit_rate, 4),
            "samples_per_s": round(self.samples_per_s, 3),
            "tokens_per_s": round(self.tokens_per_s, 1),
        }

    def summary(self) -> str:
        return (
            f"stream epoch {self.epoch}: {self.samples} samples ({self.tokens} tokens) in {self.elapsed_s:.1f} s, "
            f"{self.samples_per_s:.2f} samples/s, {self.tokens_per_s:.0f} tokens/s; cache hit rate {self.hit_rate:.1%} "
            f"({self.hits} read, {self.captured} captured in {self.requests} requests, {self.uncached} not kept); "
            f"evicted {self.evicted_shards} shards ({self.evicted_samples} samples), {len(self.damaged_shards)} damaged; failed {self.failed}, quarantined {self.quarantined}; "
            f"cache {self.cache_samples} samples, {self.cache_bytes} bytes"
        )

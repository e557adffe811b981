"""Settings of datasets in object storage (``s3://``, ``gs://``, ``hf://``, ``file://``): validated, unknown keys refused.

Defaults come from the environment so a batch job sets them once for every rank and
trainer (``HS_DATASET_CACHE_DIR``, ``HS_DATASET_CACHE_BYTES``, ``HS_DATASET_STAGE_DIR``,
``HS_DATASET_REQUEST_TIMEOUT_S``);
credentials and endpoints stay with the storage library (``AWS_*`` variables for s3fs,
or ``storage_options``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hs_dataset.errors import UsageError

__all__ = ["DEFAULT_CACHE_BYTES", "DEFAULT_MIN_BYTES_PER_S", "DEFAULT_REQUEST_TIMEOUT_S", "FollowSettings", "RemoteOptions"]

DEFAULT_CACHE_BYTES = 64 << 30
DEFAULT_REQUEST_TIMEOUT_S = 30.0
DEFAULT_MIN_BYTES_PER_S = 1 << 20


def _env_path(name: str, default: str) -> Path:
    return Path(os.path.expanduser(os.environ.get(name) or default))


def _env_bytes(name: str, default: int) -> int:
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"environment variable {name}={text[:40]!r}: give a whole number of bytes (e.g. {default})") from None
    if value <= 0:
        raise UsageError(f"environment variable {name}={value}: the cache bound must be > 0 bytes")
    return value


def _env_seconds(name: str, default: float) -> float:
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"environment variable {name}={text[:40]!r}: give a number of seconds (e.g. {default:g})") from None
    if not 0 < value <= 3600:
        raise UsageError(f"environment variable {name}={value:g}: give seconds in (0, 3600]")
    return value


class RemoteOptions(BaseModel):
    """How a remote dataset is read (the bounded local cache, prefetch) and written (the local staging directory)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cache_dir: Path = Field(
        default_factory=lambda: _env_path("HS_DATASET_CACHE_DIR", "~/.cache/hs_dataset/remote"),
        description="Where downloaded shards are kept (content-addressed, shared by datasets and processes).",
    )
    max_cache_bytes: int = Field(
        default_factory=lambda: _env_bytes("HS_DATASET_CACHE_BYTES", DEFAULT_CACHE_BYTES),
        gt=0,
        description="Bytes the cache directory may hold on disk, downloads in flight included; least recently used shards are evicted.",
    )
    prefetch_shards: int = Field(2, ge=0, le=64, description="Shards downloaded ahead of the one being read.")
    stage_dir: Path | None = Field(
        default_factory=lambda: Path(os.environ["HS_DATASET_STAGE_DIR"]) if os.environ.get("HS_DATASET_STAGE_DIR") else None,
        description="build --out URL: the local directory the writer fills before upload (default: under the cache dir, one per URL).",
    )
    upload_interval_s: float = Field(10.0, gt=0, description="build --out URL: seconds between uploads of newly published shards.")
    storage_options: dict[str, Any] = Field(default_factory=dict, description="Passed to the fsspec filesystem (endpoint_url, key, ...).")
    request_timeout_s: float = Field(
        default_factory=lambda: _env_seconds("HS_DATASET_REQUEST_TIMEOUT_S", DEFAULT_REQUEST_TIMEOUT_S),
        gt=0,
        le=3600,
        description="Total seconds one request to the store (a size, a listing, a manifest or header read) may take, answer included.",
    )
    min_bytes_per_s: int = Field(
        DEFAULT_MIN_BYTES_PER_S,
        gt=0,
        description="Slowest average rate a download is given: N bytes must arrive within request_timeout_s + N / min_bytes_per_s seconds.",
    )


class FollowSettings(BaseModel):
    """``follow_dataset``'s own arguments, checked before the first poll (typed, ranges, unknown keys refused)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    poll_s: float = Field(gt=0, le=86400, description="Seconds between polls of the followed manifests.")
    idle_timeout_s: float | None = Field(ge=0, description="End after this many seconds without a new shard (None: never).")

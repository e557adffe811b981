"""How a server process captures: :class:`CaptureConfig`, from the hook config or ``HS_CAPTURE_*`` env vars.

Runs inside SGLang scheduler processes: stdlib, the contract and the codec registry only. The
forward-hooks specs (0.5.9+) carry the config as JSON (``hs-dataset serve`` writes
it); the SGLang <= 0.5.5 source patch has no place for one, so there the env vars
are the only source.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hs_dataset.codecs.registry import STORAGE_VALUES, encoding_of_storage
from hs_dataset.server_patch.contract.mechanism import DEFAULT_MECHANISM, Mechanism

__all__ = ["ENV_PREFIX", "CaptureConfig"]

ENV_PREFIX = "HS_CAPTURE_"

_GiB = 1 << 30


@dataclass(frozen=True)
class CaptureConfig:
    """How a server process captures; from the forward-hooks ``config`` and ``HS_CAPTURE_*`` env vars.

    Keys of the JSON config (env var in brackets, used when the key is absent):
    ``staging_dir`` [HS_CAPTURE_STAGING_DIR], ``hf_aux_layer_ids`` [HS_CAPTURE_LAYER_IDS,
    comma-separated; ``[]`` in the JSON config: the final state only], ``rid_prefix`` [HS_CAPTURE_RID_PREFIX], ``max_staging_bytes``
    [HS_CAPTURE_MAX_BYTES], ``max_staging_files`` [HS_CAPTURE_MAX_FILES], ``max_wait_s``
    [HS_CAPTURE_MAX_WAIT_S], ``writer_threads`` [HS_CAPTURE_WRITERS], ``pinned_pool_bytes``
    [HS_CAPTURE_PINNED_BYTES], ``orphan_ttl_s`` [HS_CAPTURE_ORPHAN_TTL_S], ``assembly_ttl_s``
    [HS_CAPTURE_ASSEMBLY_TTL_S], ``content_keys`` [HS_CAPTURE_CONTENT_KEYS], ``storage``
    [HS_CAPTURE_STORAGE: ``native``, ``fp8``, ``mxfp4`` or ``nf4``, quantized on the device],
    ``one_pass_piece_rows`` [HS_CAPTURE_PIECE_ROWS: rows of a one-pass request written per piece],
    ``one_pass_held_bytes`` [HS_CAPTURE_HELD_BYTES: one-pass rows held in host memory, all requests
    together, before all are written out]; plus
    ``mechanism``, ``module_path``, ``sglang_aux_layer_ids``, ``architectures``,
    ``num_hidden_layers`` (written by ``hs-dataset serve``).
    """

    staging_dir: str
    hf_aux_layer_ids: tuple[int, ...]
    rid_prefix: str = "hs-"
    mechanism: Mechanism = DEFAULT_MECHANISM  # a string is accepted and parsed (the JSON config carries the value)
    module_path: str = "model"
    sglang_aux_layer_ids: tuple[int, ...] | None = None
    architectures: tuple[str, ...] = ()
    num_hidden_layers: int | None = None
    max_staging_bytes: int = 16 * _GiB
    max_staging_files: int = 4096
    max_wait_s: float = 2.0
    # dumps go out with one writev from pinned memory; 4 threads keep up with a
    # Kimi-K2.5 node's prefill with room to spare (bench_gpu_capture.py, see docs/BENCHMARKS.md)
    writer_threads: int = 4
    pinned_pool_bytes: int = 2 * _GiB
    orphan_ttl_s: float = 3600.0
    assembly_ttl_s: float = 600.0
    sweep_interval_s: float = 15.0
    content_keys: bool = True
    storage: str = "native"
    # One-pass rows wait in plain host memory until a piece is written: one slot of piece_rows rows per request,
    # held_bytes for all slots (a request that finds none free has the fullest written first). 256 rows of
    # Kimi-K2.5's 3 aux layers and final state in bf16 are 14.7 MB, so 2 GiB is 146 slots: more than the 128
    # requests a Kimi server runs; nf4 rows are 0.28 of that (over 500 slots).
    one_pass_piece_rows: int = 256
    one_pass_held_bytes: int = 2 * _GiB

    STORAGES = STORAGE_VALUES

    def __post_init__(self) -> None:
        if not self.staging_dir:
            raise ValueError("capture config: staging_dir is required (config key or HS_CAPTURE_STAGING_DIR)")
        if self.hf_aux_layer_ids is None:
            raise ValueError("capture config: hf_aux_layer_ids is required (config key or HS_CAPTURE_LAYER_IDS)")
        ids = list(self.hf_aux_layer_ids)  # none: the final state only
        if any(b <= a for a, b in itertools.pairwise(ids)) or (ids and ids[0] < 0):
            raise ValueError(f"capture config: hf_aux_layer_ids must be ascending and >= 0, got {ids}")
        if not self.rid_prefix.startswith("hs-") or not all(c.isalnum() or c == "-" for c in self.rid_prefix):
            raise ValueError(f"capture config: rid_prefix must start with 'hs-' and hold only [a-z0-9-], got {self.rid_prefix!r}")
        object.__setattr__(self, "mechanism", Mechanism.parse(self.mechanism, "capture config"))
        for name in ("max_staging_bytes", "max_staging_files", "writer_threads", "one_pass_piece_rows", "one_pass_held_bytes"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"capture config: {name} must be >= 1")
        if self.max_wait_s < 0:
            raise ValueError("capture config: max_wait_s must be >= 0")
        if self.storage not in self.STORAGES:
            raise ValueError(f"capture config: storage must be one of {self.STORAGES}, got {self.storage!r}")

    @property
    def state_encoding(self) -> str | None:
        """The encoding the states are quantized to on the device before the copy (``None``: stored as computed)."""
        return encoding_of_storage(self.storage)

    @classmethod
    def from_sources(cls, config: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> CaptureConfig:
        """The config from the hook's JSON ``config``, each absent key from its ``HS_CAPTURE_*`` env var."""
        config = dict(config or {})
        environ = os.environ if environ is None else environ
        unknown = set(config) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"capture config: unknown keys {sorted(unknown)}")

        def pick(key: str, env_key: str, conv: Callable[[Any], Any]) -> Any:
            if key in config and config[key] is not None:
                return conv(config[key])
            raw = environ.get(ENV_PREFIX + env_key)
            return conv(raw) if raw not in (None, "") else None

        values: dict[str, Any] = {
            "staging_dir": pick("staging_dir", "STAGING_DIR", str),
            "hf_aux_layer_ids": pick("hf_aux_layer_ids", "LAYER_IDS", _layer_ids),
            "rid_prefix": pick("rid_prefix", "RID_PREFIX", str),
            "max_staging_bytes": pick("max_staging_bytes", "MAX_BYTES", int),
            "max_staging_files": pick("max_staging_files", "MAX_FILES", int),
            "max_wait_s": pick("max_wait_s", "MAX_WAIT_S", float),
            "writer_threads": pick("writer_threads", "WRITERS", int),
            "pinned_pool_bytes": pick("pinned_pool_bytes", "PINNED_BYTES", int),
            "orphan_ttl_s": pick("orphan_ttl_s", "ORPHAN_TTL_S", float),
            "assembly_ttl_s": pick("assembly_ttl_s", "ASSEMBLY_TTL_S", float),
            "content_keys": pick("content_keys", "CONTENT_KEYS", _boolean),
            "sweep_interval_s": pick("sweep_interval_s", "SWEEP_INTERVAL_S", float),
            "storage": pick("storage", "STORAGE", str),
            "one_pass_piece_rows": pick("one_pass_piece_rows", "PIECE_ROWS", int),
            "one_pass_held_bytes": pick("one_pass_held_bytes", "HELD_BYTES", int),
        }
        for key in ("mechanism", "module_path", "num_hidden_layers"):
            if config.get(key) is not None:
                values[key] = config[key]
        if config.get("sglang_aux_layer_ids") is not None:
            values["sglang_aux_layer_ids"] = _layer_ids(config["sglang_aux_layer_ids"])
        if config.get("architectures"):
            values["architectures"] = tuple(config["architectures"])
        for required, env_key in (("staging_dir", "STAGING_DIR"), ("hf_aux_layer_ids", "LAYER_IDS")):
            if values.get(required) is None or values[required] == "":  # an empty id list is the final state only
                raise ValueError(f"capture config: {required} is required (config key or {ENV_PREFIX}{env_key})")
        return cls(**{k: v for k, v in values.items() if v is not None})

    def to_json(self) -> dict:
        out = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = list(value) if isinstance(value, tuple) else value.value if isinstance(value, Mechanism) else value
        return out


def _layer_ids(value: Any) -> tuple[int, ...]:
    """Layer ids from a list, or from a string separated by commas and/or spaces (an env var)."""
    if isinstance(value, str):
        return tuple(int(x) for x in value.replace(" ", ",").split(",") if x)
    return tuple(int(x) for x in value)


def _boolean(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)

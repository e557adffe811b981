"""The dataset manifest (``manifest.json``): what the data means and which bytes are valid.

A shard is part of the dataset only once the manifest lists it with its size and
sha256. The manifest is rewritten atomically after every shard, so at any instant
the files it names are complete. Readers refuse manifests of a newer format version.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hs_dataset.errors import FormatError, UnsupportedFormatError
from hs_dataset.formats.atomic import atomic_write_bytes

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "ShardRecord",
    "Manifest",
    "identity_fingerprint",
    "IDENTITY_KEYS",
]

FORMAT_NAME = "hs_dataset"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"

# Metadata keys that define *which* dataset this is. Reopening a directory with a
# writer whose metadata differs in any of these is refused (it would mix datasets).
IDENTITY_KEYS = (
    "config_name",
    "config_fingerprint",
    "model",
    "aux_layer_ids",
    "layer_convention",
    "final_state",
    "dtype",
    "hidden_size",
)


def identity_fingerprint(metadata: dict[str, Any]) -> str:
    """sha256 over the identity part of the metadata (canonical JSON)."""
    identity = {k: metadata.get(k) for k in IDENTITY_KEYS}
    if isinstance(identity["model"], dict):  # the weights define the data, not where they lie on disk
        identity["model"] = {k: identity["model"].get(k) for k in ("id", "fingerprint")}
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class ShardRecord:
    """One published shard: name relative to the dataset root, counts, size and hash."""

    file: str
    samples: int
    tokens: int
    bytes: int
    sha256: str
    dataset_id: str | None = None  # set in merged datasets: the part this shard was written for

    def to_json(self) -> dict[str, Any]:
        raw = asdict(self)
        if raw["dataset_id"] is None:
            del raw["dataset_id"]
        return raw

    @classmethod
    def from_json(cls, raw: dict[str, Any], where: str) -> "ShardRecord":
        try:
            dataset_id = raw.get("dataset_id")
            return cls(
                str(raw["file"]), int(raw["samples"]), int(raw["tokens"]), int(raw["bytes"]), str(raw["sha256"]),
                None if dataset_id is None else str(dataset_id),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(f"{where}: malformed shard entry {raw!r} ({exc})") from None


@dataclass
class Manifest:
    """In-memory form of ``manifest.json`` (see docs/FORMAT.md for every field)."""

    dataset_id: str
    metadata: dict[str, Any]
    tensors: dict[str, dict[str, Any]]
    shards: list[ShardRecord] = field(default_factory=list)
    quarantine: list[dict[str, str]] = field(default_factory=list)
    created_by: str = ""
    format: str = FORMAT_NAME
    format_version: int = FORMAT_VERSION
    identity: str = ""

    def __post_init__(self) -> None:
        if not self.identity:
            self.identity = identity_fingerprint(self.metadata)

    # ---- derived totals -------------------------------------------------
    @property
    def num_samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def num_tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    @property
    def num_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    @property
    def aux_layer_ids(self) -> list[int]:
        return list(self.metadata["aux_layer_ids"])

    @property
    def hidden_size(self) -> int:
        return int(self.metadata["hidden_size"])

    # ---- serialisation -------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "format_version": self.format_version,
            "dataset_id": self.dataset_id,
            "identity": self.identity,
            "created_by": self.created_by,
            "metadata": self.metadata,
            "tensors": self.tensors,
            "totals": {"samples": self.num_samples, "tokens": self.num_tokens, "bytes": self.num_bytes, "shards": len(self.shards)},
            "shards": [s.to_json() for s in self.shards],
            "quarantine": self.quarantine,
        }

    def save(self, root: Path) -> None:
        """Atomically replace ``root/manifest.json``."""
        data = json.dumps(self.to_json(), indent=1, sort_keys=False).encode("utf-8") + b"\n"
        atomic_write_bytes(Path(root) / MANIFEST_NAME, data)

    @classmethod
    def from_json(cls, raw: Any, where: str) -> "Manifest":
        if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
            raise FormatError(f"{where}: not an hs_dataset manifest (format={raw.get('format') if isinstance(raw, dict) else None!r})")
        version = raw.get("format_version")
        if not isinstance(version, int):
            raise FormatError(f"{where}: format_version is missing or not an integer")
        if version > FORMAT_VERSION:
            raise UnsupportedFormatError(
                f"{where}: format version {version} is newer than this hs_dataset understands ({FORMAT_VERSION}); "
                "upgrade hs_dataset (pip install -U hs_dataset) to read it"
            )
        try:
            manifest = cls(
                dataset_id=str(raw["dataset_id"]),
                metadata=dict(raw["metadata"]),
                tensors=dict(raw["tensors"]),
                shards=[ShardRecord.from_json(s, where) for s in raw["shards"]],
                quarantine=list(raw.get("quarantine", [])),
                created_by=str(raw.get("created_by", "")),
                format_version=version,
                identity=str(raw.get("identity", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(f"{where}: manifest is missing or has a malformed field ({exc})") from None
        return manifest

    @classmethod
    def load(cls, root: Path) -> "Manifest":
        path = Path(root) / MANIFEST_NAME
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FormatError(f"{root}: no {MANIFEST_NAME}; this is not an hs_dataset dataset (or nothing was written yet)") from None
        except json.JSONDecodeError as exc:
            raise FormatError(f"{path}: not valid JSON ({exc}); the file was edited or damaged") from None
        return cls.from_json(raw, str(path))

"""The dataset manifest (``manifest.json``): what the data means and which bytes are valid.

A shard is part of the dataset only once the manifest lists it with its size and
hash (BLAKE3 since format 2; format-1 manifests record sha256). The manifest is
rewritten atomically after every shard, so at any instant the files it names are
complete. Readers refuse manifests of a newer format version.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hs_dataset import strict_json
from hs_dataset.errors import FormatError, HsDatasetError, IntegrityError, UnsupportedFormatError
from hs_dataset.formats.atomic import atomic_write_bytes
from hs_dataset.formats.build_state import BuildState
from hs_dataset.formats.claims import check_claims
from hs_dataset.formats.hashing import HASH_ALGORITHMS
from hs_dataset.formats.identity import identity_fingerprint, legacy_identity_fingerprint
from hs_dataset.formats.metadata import DatasetMetadata
from hs_dataset.formats.paths import check_local_path, check_member_name, check_plain_name, open_member
from hs_dataset.formats.repair_record import PendingRepair
from hs_dataset.formats.shard_layout import AUX_KEY, FINAL_KEY, INPUT_IDS_KEY, LOSS_MASK_KEY, OFFSETS_KEY, state_keys

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "MAX_MANIFEST_BYTES",
    "Manifest",
    "ShardRecord",
    "is_dataset_dir",
    "read_manifest_bytes",
]

FORMAT_NAME = "hs_dataset"
MAX_MANIFEST_BYTES = 256 * 1024 * 1024  # ~1M shard entries; bounds what a hostile manifest can make us parse
_HEX256_RE = re.compile(r"^[0-9a-f]{64}$")  # both sha256 and BLAKE3 (default length) digests are 32 bytes
FORMAT_VERSION = 2  # 2: shards hashed with BLAKE3 (``blake3``); 1: sha256 only (still read and verified)
MANIFEST_NAME = "manifest.json"


def _captured_by(raw: Any, field_name: str, where: str) -> dict[str, int] | None:
    """An optional ``{capture path: samples}`` map (shards of a one-pass build)."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not all(isinstance(k, str) and len(k) <= 32 for k in raw):
        raise FormatError(f"{where}: {field_name} must map capture paths to sample counts; restore the manifest")
    return {k: _count(v) for k, v in raw.items()}


@dataclass
class ShardRecord:
    """One published shard: name relative to the dataset root, counts, size and hash(es).

    Shards written since format 2 carry ``blake3``; format-1 shards carry ``sha256``
    (and keep it when a newer writer resumes their dataset). At least one is set;
    checks use :attr:`hash_algorithm`, the best one recorded.
    """

    file: str
    samples: int
    tokens: int
    bytes: int
    sha256: str | None = None
    dataset_id: str | None = None  # set in merged datasets: the part this shard was written for
    blake3: str | None = None
    captured_by: dict[str, int] | None = None  # samples per capture path, where a build captured two ways (one_pass, prefill)

    def __post_init__(self) -> None:
        if self.sha256 is None and self.blake3 is None:
            raise ValueError(f"shard {self.file!r} needs a hash (blake3 or sha256)")

    @property
    def hash_algorithm(self) -> str:
        """The algorithm a check of this shard uses: the first of HASH_ALGORITHMS it records."""
        return next(name for name in HASH_ALGORITHMS if getattr(self, name) is not None)

    @property
    def digest(self) -> str:
        """The recorded hex digest of :attr:`hash_algorithm`."""
        return str(getattr(self, self.hash_algorithm))

    @property
    def content_hash(self) -> str:
        """One string naming these bytes (index rows carry it): sha256 hex as in format 1, else ``blake3:<hex>``."""
        return self.digest if self.hash_algorithm == "sha256" else f"{self.hash_algorithm}:{self.digest}"

    def to_json(self) -> dict[str, Any]:
        raw = asdict(self)
        for optional in ("sha256", "dataset_id", "blake3", "captured_by"):
            if raw[optional] is None:
                del raw[optional]
        return raw

    @classmethod
    def from_json(cls, raw: dict[str, Any], where: str, index: int = 0, *, version: int = FORMAT_VERSION) -> ShardRecord:
        field_name = f"shards[{index}]"
        if not isinstance(raw, dict):
            raise FormatError(f"{where}: {field_name} is a {type(raw).__name__}, not an object; restore the manifest")
        # format 1 knows only sha256: a blake3 there would be a hash no format-1 reader checks
        algorithms = HASH_ALGORITHMS if version >= 2 else ("sha256",)
        hashes = {name: raw.get(name) for name in algorithms}
        if all(h is None for h in hashes.values()):
            raise FormatError(
                f"{where}: {field_name} records no hash (format {version} needs {' or '.join(algorithms)}); restore the manifest"
            )
        for name, value in hashes.items():
            if value is not None and not (isinstance(value, str) and _HEX256_RE.match(value)):
                raise FormatError(f"{where}: {field_name}.{name} {str(value)[:80]!r} is not a {name} hex digest; restore the manifest")
        try:
            dataset_id = raw.get("dataset_id")
            return cls(
                check_member_name(raw["file"], what=f"{field_name}.file", where=where),
                _count(raw["samples"]),
                _count(raw["tokens"]),
                _count(raw["bytes"]),
                hashes.get("sha256"),
                None if dataset_id is None else check_plain_name(dataset_id, what=f"{field_name}.dataset_id", where=where),
                hashes.get("blake3"),
                _captured_by(raw.get("captured_by"), f"{field_name}.captured_by", where),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(f"{where}: malformed {field_name} {str(raw)[:200]} ({exc}); restore the manifest") from None


def _count(value: Any) -> int:
    """A non-negative integer field (``int(1.5)`` or ``True`` would silently mean something else)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a non-negative integer")
    return value


@dataclass
class Manifest:
    """In-memory form of ``manifest.json`` (see docs/FORMAT.md for every field)."""

    dataset_id: str
    metadata: DatasetMetadata
    tensors: dict[str, dict[str, Any]]
    shards: list[ShardRecord] = field(default_factory=list)
    quarantine: list[dict[str, str]] = field(default_factory=list)
    created_by: str = ""
    format: str = FORMAT_NAME
    format_version: int = FORMAT_VERSION
    identity: str = ""
    build: BuildState | None = None  # whether the build that writes it finished (None: not recorded; see build_state)
    repair: PendingRepair | None = None  # shards a repair took out, until their samples are stored again (repair_record)

    def __post_init__(self) -> None:
        self.metadata = DatasetMetadata.coerce(self.metadata)
        if not self.identity:
            self.identity = identity_fingerprint(self.metadata)

    # ---- derived totals -------------------------------------------------
    @property
    def num_samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def unfinished(self) -> bool:
        """True while the build writing this dataset has not finished (a dataset without the record counts as finished)."""
        return self.build is not None and not self.build.finished

    @property
    def num_tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    @property
    def num_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    @property
    def aux_layer_ids(self) -> list[int]:
        return list(self.metadata.aux_layer_ids or ())

    @property
    def hidden_size(self) -> int:
        return int(self.metadata.hidden_size or 0)

    @property
    def state_encoding(self) -> str:
        """The encoding name of the stored states: one for both, read off the final state (a dataset may hold no aux tensor)."""
        return str(self.tensors[FINAL_KEY]["encoding"])

    # ---- serialisation -------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        # a format-1 dataset stays format 1 (old readers keep reading it) until it lists a BLAKE3-hashed shard
        if any(s.blake3 is not None for s in self.shards):
            self.format_version = max(self.format_version, 2)
        raw: dict[str, Any] = {
            "format": self.format,
            "format_version": self.format_version,
            "dataset_id": self.dataset_id,
            "identity": self.identity,
            "created_by": self.created_by,
            "metadata": self.metadata.to_json(),
            "tensors": self.tensors,
            "totals": {"samples": self.num_samples, "tokens": self.num_tokens, "bytes": self.num_bytes, "shards": len(self.shards)},
            "shards": [s.to_json() for s in self.shards],
            "quarantine": self.quarantine,
        }
        if self.build is not None:  # absent stays absent: a dataset without the record keeps its bytes on a rewrite
            raw["build"] = self.build.to_json()
        if self.repair is not None:
            raw["repair"] = self.repair.to_json()
        return raw

    def encode(self, *, sort_keys: bool = False) -> bytes:
        """The manifest file's bytes (taken under a writer's lock; written after it is let go)."""
        return json.dumps(self.to_json(), indent=1, sort_keys=sort_keys).encode("utf-8") + b"\n"

    def save(self, root: Path) -> None:
        """Atomically replace ``root/manifest.json``."""
        atomic_write_bytes(Path(root) / MANIFEST_NAME, self.encode())

    @classmethod
    def from_json(cls, raw: Any, where: str) -> Manifest:
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
                dataset_id=check_plain_name(raw["dataset_id"], what="dataset_id", where=where),
                metadata=DatasetMetadata.from_json(raw["metadata"], where),
                tensors=dict(raw["tensors"]),
                shards=[ShardRecord.from_json(s, where, i, version=version) for i, s in enumerate(raw["shards"])],
                quarantine=list(raw.get("quarantine", [])),
                created_by=str(raw.get("created_by", "")),
                format_version=version,
                identity=str(raw.get("identity", "")),
                build=None if raw.get("build") is None else BuildState.from_json(raw["build"], where),
                repair=None if raw.get("repair") is None else PendingRepair.from_json(raw["repair"], where),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(f"{where}: manifest is missing or has a malformed field ({exc})") from None
        _check_members(manifest, where)
        _check_identity(manifest, raw.get("identity"), where)
        check_claims(manifest.metadata, manifest.tensors, where)  # what no hash covers: layer ids, dtype
        return manifest

    @classmethod
    def load(cls, root: Path) -> Manifest:
        path = check_local_path(root, what="dataset") / MANIFEST_NAME
        try:
            raw = strict_json.loads(read_manifest_bytes(root).decode("utf-8"))
        except FileNotFoundError:
            raise FormatError(f"{root}: no {MANIFEST_NAME}; this is not an hs_dataset dataset (or nothing was written yet)") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise FormatError(f"{path}: not valid JSON ({exc}); the file was edited or damaged") from None
        except RecursionError:
            raise FormatError(f"{path}: JSON nested too deeply; the file was edited or damaged") from None
        return cls.from_json(raw, str(path))


def read_manifest_bytes(root: str | os.PathLike) -> bytes:
    """The bytes of ``root/manifest.json``: a regular file inside ``root``, at most MAX_MANIFEST_BYTES."""
    with open_member(root, MANIFEST_NAME, what="the manifest") as f:
        data = f.read(MAX_MANIFEST_BYTES + 1)
    if len(data) > MAX_MANIFEST_BYTES:
        raise FormatError(
            f"{Path(root) / MANIFEST_NAME}: larger than {MAX_MANIFEST_BYTES} bytes; not a manifest hs_dataset writes "
            "(the file was replaced or damaged)"
        )
    return data


def is_dataset_dir(root: str | os.PathLike) -> bool:
    """True when ``root`` holds an hs_dataset manifest (even a damaged one): such a directory is never wiped."""
    path = Path(root) / MANIFEST_NAME
    if not os.path.lexists(path):
        return False
    try:
        raw = strict_json.loads(read_manifest_bytes(root).decode("utf-8"))
    except (HsDatasetError, OSError, ValueError, RecursionError):
        return True  # unreadable: assume the worst, a damaged dataset is still someone's data
    return isinstance(raw, dict) and raw.get("format") == FORMAT_NAME


def _check_identity(manifest: Manifest, recorded: Any, where: str) -> None:
    """The recorded ``identity`` must be the hash of the metadata it covers, recomputed here.

    Shard headers do not repeat the aux layer ids or the model: a manifest whose
    identity fields were edited would otherwise read, verify and merge as the dataset it
    claims to be. A manifest written before the identity was narrowed to the fields that
    define the data records the older hash (``formats/identity.py``); either is accepted.
    """
    if recorded is None:
        return  # written before the identity was recorded: nothing to check it against
    if recorded not in (identity_fingerprint(manifest.metadata), legacy_identity_fingerprint(manifest.metadata)):
        raise IntegrityError(
            f"{where}: field identity {str(recorded)[:16]!r}... is not the hash of the metadata fields it covers "
            "(model, tokenizer, layers, dtype, source and their settings; one of them was edited after the capture): "
            "restore the manifest from a copy or rebuild the dataset"
        )


def _check_members(manifest: Manifest, where: str) -> None:
    """Names and counts a reader trusts: no shard listed twice, a norm weight file named safely."""
    seen: set[str] = set()
    for i, record in enumerate(manifest.shards):
        if record.file in seen:
            raise FormatError(f"{where}: shards[{i}].file {record.file!r} is listed twice; restore the manifest")
        seen.add(record.file)
    _check_shape_fields(manifest, where)  # the final norm's weight file name is checked as the metadata is read


def _check_shape_fields(manifest: Manifest, where: str) -> None:
    """The fields readers compute shapes from: small non-negative ints, tensor entries with an encoding name."""
    ids, hidden = manifest.metadata.aux_layer_ids, manifest.metadata.hidden_size  # types and ranges checked as they are read
    if ids is None:
        raise FormatError(f"{where}: metadata.aux_layer_ids must be a list of HF hidden_states indexes, got None; restore the manifest")
    if hidden is None:
        raise FormatError(f"{where}: metadata.hidden_size must be a positive integer, got None; restore the manifest")
    for name, entry in manifest.tensors.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("encoding"), str):
            raise FormatError(f"{where}: tensors.{name} needs an 'encoding' name; restore the manifest")
    fixed = {OFFSETS_KEY: "int64", INPUT_IDS_KEY: "int64", LOSS_MASK_KEY: "bool"}
    for name in (*fixed, *state_keys(len(ids))):
        if name not in manifest.tensors:
            raise FormatError(f"{where}: tensors.{name} is missing; every dataset records its encoding; restore the manifest")
    if not ids and AUX_KEY in manifest.tensors:
        raise FormatError(
            f"{where}: tensors.{AUX_KEY} is listed but metadata.aux_layer_ids is empty (the final state only); restore the manifest"
        )
    wrong = [n for n, enc in fixed.items() if manifest.tensors[n]["encoding"] != enc]
    if wrong:
        raise FormatError(
            f"{where}: tensors {wrong} have the wrong encoding (offsets and ids are int64, the mask bool); restore the manifest"
        )
    for i, entry in enumerate(manifest.quarantine):
        if not isinstance(entry, dict) or not isinstance(entry.get("sample_id"), str):
            raise FormatError(f"{where}: quarantine[{i}] needs a 'sample_id' string; restore the manifest")

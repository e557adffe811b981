"""The manifest's ``metadata``, typed: what the stored tensors mean and where they came from.

:class:`DatasetMetadata` and its nested records are frozen dataclasses; only this
module reads and writes their JSON form (``from_json`` / ``to_json``), every other
module reads attributes. Every field is optional at this level, since old manifests,
imports and stream caches record subsets; the reader (:mod:`~hs_dataset.formats.manifest`)
requires what shapes are computed from.

Two rules keep the bytes of ``manifest.json`` stable across a read and a rewrite:

* ``json_keys`` remembers which keys the JSON carried and in which order, so a key
  written as ``null`` stays ``null`` and an absent key stays absent; a field set later
  (``dataclasses.replace``) is appended after them.
* Unknown keys (from a newer writer of the same format version) are kept in ``extra``
  and written back unchanged, not refused: format changes that old readers must not
  misread bump ``format_version``, which :class:`~hs_dataset.formats.manifest.Manifest`
  refuses; a key added without a bump is informational, and refusing it would strand
  datasets (a resume would also silently drop it if it were not kept).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from hs_dataset.errors import FormatError
from hs_dataset.formats.paths import check_member_name

__all__ = [
    "HF_HIDDEN_STATES_INDEX",
    "BackendRecord",
    "DatasetMetadata",
    "FinalNorm",
    "LayerPreset",
    "MetadataRecord",
    "ModelRecord",
    "RegeneratedFile",
    "RegenerationRecord",
    "SourceRecord",
    "TokenizerRecord",
]

HF_HIDDEN_STATES_INDEX = "hf_hidden_states_index"  # the layer convention: ids index HF ``hidden_states``

R = TypeVar("R", bound="MetadataRecord")
Parser = Callable[[Any, str, str], Any]  # (value, file, field name) -> typed value


def _bad(where: str, name: str, wanted: str, value: Any) -> FormatError:
    return FormatError(f"{where}: metadata.{name} must be {wanted}, got {str(value)[:80]}; restore the manifest")


def _str(value: Any, where: str, name: str) -> str:
    if not isinstance(value, str):
        raise _bad(where, name, "a string", value)
    return value


def _int(value: Any, where: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(where, name, "an integer", value)
    return value


def _number(value: Any, where: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(where, name, "a number", value)
    return value


def _bool(value: Any, where: str, name: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(where, name, "true or false", value)
    return value


def _token_ids(value: Any, where: str, name: str) -> tuple[int, ...]:
    """Token ids as a build records them (stop and structure ids): integers 0 or more; the vocabulary bound is a claim
    (``formats/claims.py``), since it needs the metadata's ``vocab_size``."""
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
        raise _bad(where, name, "a list of token ids (integers 0 or more)", value)
    return tuple(value)


def _object(value: Any, where: str, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(where, name, "an object", value)
    return dict(value)


def _json_value(value: Any) -> Any:
    """A field value in JSON form: records as objects, tuples as lists."""
    if isinstance(value, MetadataRecord):
        return value.to_json()
    if isinstance(value, tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    return value


def _map_strings(value: Any, change: Callable[[str], str]) -> Any:
    if isinstance(value, dict):
        return {k: _map_strings(v, change) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_strings(v, change) for v in value]
    return change(value) if isinstance(value, str) else value


@dataclass(frozen=True)
class MetadataRecord:
    """A JSON object with typed known keys: presence and order kept in ``json_keys``, unknown keys in ``extra``.

    ``json_keys`` None (a record built in code) means :attr:`_DEFAULT_KEYS`.
    """

    json_keys: tuple[str, ...] | None = field(default=None, kw_only=True, repr=False, compare=False)
    extra: dict[str, Any] = field(default_factory=dict, kw_only=True)

    _PARSERS: ClassVar[dict[str, Parser]] = {}
    _JSON_NAMES: ClassVar[dict[str, str]] = {}  # field name -> JSON key where they differ (``class``)
    _DEFAULT_KEYS: ClassVar[tuple[str, ...] | None] = None  # None: every field
    _NOT_NULL: ClassVar[tuple[str, ...]] = ()  # fields whose key, when present, must not be null

    def __post_init__(self) -> None:
        if self.json_keys is None:
            keys = self._DEFAULT_KEYS if self._DEFAULT_KEYS is not None else tuple(self._fields())
            object.__setattr__(self, "json_keys", tuple(self._json_name(k) for k in keys) + tuple(self.extra))

    @classmethod
    def _fields(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.name not in ("json_keys", "extra")]

    @classmethod
    def _json_name(cls, name: str) -> str:
        return cls._JSON_NAMES.get(name, name)

    def to_json(self) -> dict[str, Any]:
        """The JSON object: the recorded keys in order (nulls kept), then fields set since, then nothing else."""
        by_json = {self._json_name(name): name for name in self._fields()}
        out: dict[str, Any] = {}
        for key in self.json_keys or ():
            if key in by_json:
                out[key] = _json_value(getattr(self, by_json[key]))
            elif key in self.extra:
                out[key] = _json_value(self.extra[key])
        for key, name in by_json.items():
            if key not in out and getattr(self, name) is not None:
                out[key] = _json_value(getattr(self, name))
        for key, value in self.extra.items():
            out.setdefault(key, _json_value(value))
        return out

    @classmethod
    def from_json(cls: type[R], raw: Any, where: str, path: str = "") -> R:
        """The record of JSON object ``raw``; a known key of the wrong type is a :class:`FormatError` naming it."""
        prefix = f"{path}." if path else ""
        if not isinstance(raw, dict):
            raise _bad(where, path or "(root)", "an object", raw)
        by_json = {cls._json_name(name): name for name in cls._fields()}
        values: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in raw.items():
            name = by_json.get(key)
            if name is None:
                extra[key] = value
            elif value is not None or name in cls._NOT_NULL:
                values[name] = cls._PARSERS[name](value, where, f"{prefix}{key}")
        return cls(**values, json_keys=tuple(raw), extra=extra)

    def without(self: R, name: str) -> R:
        """This record with field ``name`` unset and left out of the JSON form (not written as null)."""
        key = self._json_name(name)
        unset: dict[str, Any] = {name: None}
        return dataclasses.replace(self, **unset, json_keys=tuple(k for k in self.json_keys or () if k != key))


def _record(cls: type[R]) -> Parser:
    def parse(value: Any, where: str, name: str) -> R:
        return cls.from_json(value, where, name)

    return parse


@dataclass(frozen=True)
class ModelRecord(MetadataRecord):
    """The target model: where it was loaded from, its Hub id and revision, and the weights' fingerprint."""

    path: str | None = None
    id: str | None = None
    revision: str | None = None
    fingerprint: str | None = None

    _PARSERS: ClassVar[dict[str, Parser]] = dict.fromkeys(("path", "id", "revision", "fingerprint"), _str)


@dataclass(frozen=True)
class LayerPreset(MetadataRecord):
    """The card's ``layers.preset``: its name, its taps and whether explicit ``aux`` ids overrode it (``ids_from``)."""

    name: str | None = None
    taps: int | None = None
    ids_from: str | None = None

    _PARSERS: ClassVar[dict[str, Parser]] = {"name": _str, "taps": _int, "ids_from": _str}


def _member_name(value: Any, where: str, name: str) -> str:
    return check_member_name(_str(value, where, name), what=f"metadata.{name}", where=where)


@dataclass(frozen=True)
class FinalNorm(MetadataRecord):
    """The model's final norm: kind and eps, and the stored weight file (name, tensor key, sha256) when there is one."""

    kind: str | None = None
    eps: float | None = None
    weight_file: str | None = None
    weight_key: str | None = None
    weight_sha256: str | None = None

    _DEFAULT_KEYS: ClassVar[tuple[str, ...] | None] = ("kind", "eps")  # the weight's keys are added once it is stored
    _NOT_NULL: ClassVar[tuple[str, ...]] = ("weight_file",)  # a listed weight names a file; readers would skip a null one
    _PARSERS: ClassVar[dict[str, Parser]] = {
        "kind": _str,
        "eps": _number,
        "weight_file": _member_name,
        "weight_key": _str,
        "weight_sha256": _str,
    }


@dataclass(frozen=True)
class TokenizerRecord(MetadataRecord):
    """The tokenizer: directory, class, vocabulary size, tokenizer-file and chat-template hashes."""

    path: str | None = None
    class_name: str | None = None
    vocab_size: int | None = None
    fingerprint: str | None = None
    chat_template_sha256: str | None = None

    _JSON_NAMES: ClassVar[dict[str, str]] = {"class_name": "class"}
    _PARSERS: ClassVar[dict[str, Parser]] = {
        "path": _str,
        "class_name": _str,
        "vocab_size": _int,
        "fingerprint": _str,
        "chat_template_sha256": _str,
    }


@dataclass(frozen=True)
class BackendRecord(MetadataRecord):
    """The capture backend's name; its own details (server arguments, versions, import source) are in ``extra``.

    The details differ per backend and are only shown, never computed with, so they stay free-form.
    """

    name: str | None = None

    _PARSERS: ClassVar[dict[str, Parser]] = {"name": _str}


@dataclass(frozen=True)
class RegeneratedFile(MetadataRecord):
    """One regenerated-conversations file: its sha256 (None while empty) and how many records it holds."""

    sha256: str | None = None
    records: int | None = None

    _PARSERS: ClassVar[dict[str, Parser]] = {"sha256": _str, "records": _int}


def _str_map(value: Any, where: str, name: str) -> dict[str, str]:
    mapping = _object(value, where, name)
    if not all(isinstance(v, str) for v in mapping.values()):
        raise _bad(where, name, "an object of strings", value)
    return mapping


@dataclass(frozen=True)
class SourceRecord(MetadataRecord):
    """Which rows a build read: the source's name (a file's name, not its directory) and its selection.

    ``name`` is ``hf:NAME``, ``builtin:NAME`` or a URL as given, a local file's or
    directory's name (moving it keeps the dataset's identity), or ``<TYPE>`` for rows
    passed in from Python; ``subset``, ``split``, ``revision`` and ``columns`` are the card's.
    """

    name: str | None = None
    subset: str | None = None
    split: str | None = None
    revision: str | None = None
    columns: dict[str, str] | None = None

    _PARSERS: ClassVar[dict[str, Parser]] = {"name": _str, "subset": _str, "split": _str, "revision": _str, "columns": _str_map}


def _files(value: Any, where: str, name: str) -> dict[str, RegeneratedFile]:
    """The listed files; their names are checked where they are opened (``verify`` reports a bad one as a problem)."""
    files = _object(value, where, name)
    return {key: RegeneratedFile.from_json(entry, where, f"{name}[{key!r}]") for key, entry in files.items()}


@dataclass(frozen=True)
class RegenerationRecord(MetadataRecord):
    """How the assistant turns were regenerated (generation parameters, engine) and the files holding them.

    ``stop_token_ids``: where an answer is cut (kept, it ends the turn); ``structure_token_ids``: the chat
    template's role markers and turn separators, which no stored answer holds (one that does is refused as
    malformed, ``regenerate/answers.py``); None where a build did not record them (written before they were).
    ``file`` names this build's file; ``files`` (name -> :class:`RegeneratedFile`) is
    filled in by the writer when the build ends; a merge keeps ``files`` only.
    """

    file: str | None = None
    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop_token_ids: tuple[int, ...] | None = None
    structure_token_ids: tuple[int, ...] | None = None
    thinking: str | None = None
    turns: int | None = None
    policy: str | None = None
    concurrency: int | None = None
    generator: dict[str, Any] | None = None
    files: dict[str, RegeneratedFile] | None = None

    _DEFAULT_KEYS: ClassVar[tuple[str, ...] | None] = (
        "file",
        "max_new_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop_token_ids",
        "structure_token_ids",
        "thinking",
        "turns",
        "policy",
        "concurrency",
        "generator",
    )
    _PARSERS: ClassVar[dict[str, Parser]] = {
        "file": _str,
        "max_new_tokens": _int,
        "temperature": _number,
        "top_p": _number,
        "seed": _int,
        "stop_token_ids": _token_ids,
        "structure_token_ids": _token_ids,
        "thinking": _str,
        "turns": _int,
        "policy": _str,
        "concurrency": _int,
        "generator": _object,
        "files": _files,
    }

    def with_file(self, name: str, entry: RegeneratedFile) -> RegenerationRecord:
        """This record with ``files[name]`` set to ``entry`` (other files kept)."""
        return dataclasses.replace(self, files={**(self.files or {}), name: entry})


def _aux_layer_ids(value: Any, where: str, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1 << 20 for i in value):
        raise FormatError(
            f"{where}: metadata.aux_layer_ids must be a list of HF hidden_states indexes, got {str(value)[:80]}; restore the manifest"
        )
    return tuple(value)


def _hidden_size(value: Any, where: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 1 << 24:
        raise FormatError(f"{where}: metadata.hidden_size must be a positive integer, got {str(value)[:80]}; restore the manifest")
    return value


def _final_norm(value: Any, where: str, name: str) -> FinalNorm:
    if not isinstance(value, dict):
        raise FormatError(f"{where}: metadata.final_norm must be an object; restore the manifest")
    return FinalNorm.from_json(value, where, name)


@dataclass(frozen=True)
class DatasetMetadata(MetadataRecord):
    """What a dataset's stored tensors mean and where they came from (the manifest's ``metadata``; docs/FORMAT.md).

    ``aux_layer_ids`` are HF ``hidden_states`` indexes (``layer_convention``);
    ``final_state`` says whether the final state is before or after the final norm.
    ``stream_cache`` marks a stream's cache directory.
    """

    config_name: str | None = None
    config_fingerprint: str | None = None
    model: ModelRecord | None = None
    aux_layer_ids: tuple[int, ...] | None = None
    layer_preset: LayerPreset | None = None
    layer_convention: str | None = None
    final_state: str | None = None
    final_norm: FinalNorm | None = None
    dtype: str | None = None
    hidden_size: int | None = None
    num_hidden_layers: int | None = None
    vocab_size: int | None = None
    tokenizer: TokenizerRecord | None = None
    max_length: int | None = None
    overflow: str | None = None
    source: SourceRecord | None = None
    limits: dict[str, Any] | None = None  # the card's ``limits`` section: which rows are skipped as oversized
    backend: BackendRecord | None = None
    capture: dict[str, Any] | None = None  # the backend's verification results: free-form, shown only
    regeneration: RegenerationRecord | None = None
    stream_cache: bool | None = None

    # A build writes these even when null (``layer_preset`` without a preset); the rest only when set.
    _DEFAULT_KEYS: ClassVar[tuple[str, ...] | None] = (
        "config_name",
        "config_fingerprint",
        "model",
        "aux_layer_ids",
        "layer_preset",
        "layer_convention",
        "final_state",
        "final_norm",
        "dtype",
        "hidden_size",
        "num_hidden_layers",
        "vocab_size",
        "tokenizer",
        "max_length",
        "overflow",
        "backend",
        "capture",
    )
    _PARSERS: ClassVar[dict[str, Parser]] = {
        "config_name": _str,
        "config_fingerprint": _str,
        "model": _record(ModelRecord),
        "aux_layer_ids": _aux_layer_ids,
        "layer_preset": _record(LayerPreset),
        "layer_convention": _str,
        "final_state": _str,
        "final_norm": _final_norm,
        "dtype": _str,
        "hidden_size": _hidden_size,
        "num_hidden_layers": _int,
        "vocab_size": _int,
        "tokenizer": _record(TokenizerRecord),
        "max_length": _int,
        "overflow": _str,
        "source": _record(SourceRecord),
        "limits": _object,
        "backend": _record(BackendRecord),
        "capture": _object,
        "regeneration": _record(RegenerationRecord),
        "stream_cache": _bool,
    }

    @classmethod
    def coerce(cls, metadata: DatasetMetadata | Mapping[str, Any], where: str = "metadata") -> DatasetMetadata:
        """``metadata`` as given, or parsed from its JSON form (a plain mapping)."""
        return metadata if isinstance(metadata, DatasetMetadata) else cls.from_json(dict(metadata), where)

    def with_strings(self, change: Callable[[str], str]) -> DatasetMetadata:
        """This metadata with every string value (at any depth, keys excepted) passed through ``change``."""
        return DatasetMetadata.from_json(_map_strings(self.to_json(), change), "metadata")

    @property
    def norm_weight_file(self) -> str | None:
        """The stored final-norm weight's file name (None when no weight is stored)."""
        return None if self.final_norm is None else self.final_norm.weight_file

    @property
    def preset_name(self) -> str | None:
        """The name of the card's layer preset (None without one)."""
        return None if self.layer_preset is None else self.layer_preset.name

    @property
    def convention(self) -> str:
        """The layer convention, the HF ``hidden_states`` index when unrecorded."""
        return self.layer_convention or HF_HIDDEN_STATES_INDEX

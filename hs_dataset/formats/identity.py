"""A dataset's identity: the metadata fields that define its data, their hash, and how two identities differ.

A resume, a stream cache and a merge must never mix two datasets, yet a card edit that
changes no stored byte must not strand a dataset. So the identity covers what defines
the data and nothing else:

* covered: the model's content (``model.fingerprint``: config.json and weights, never
  the path), the tokenizer file and chat template, the captured layers (``layers.aux``,
  ``layers.convention``, ``layers.final``), ``dtype``, ``hidden_size``, ``max_length``
  and ``overflow``, the source and its selection (``source.*``, ``limits.*``) and the
  regeneration settings (``regenerate.*``); the state encoding (``shards.storage``) is
  compared beside it (it lives in the manifest's tensor table, not in the metadata);
* left out: the card's name and fingerprint, Hub metadata (``dataset_card``), the model's
  id, revision and path, the tokenizer's path, hosts, ports, timeouts, retries,
  concurrency, staging directories and cache sizes.

Older datasets: their recorded ``identity`` hashed the whole card (``config_fingerprint``)
and more (:func:`legacy_identity_fingerprint`, still accepted as a manifest's integrity
check). Their identity is read by re-projecting the stored metadata onto the fields
above; a group of fields an older manifest does not record (``source``, ``limits``) is
not compared, so an older dataset resumes under any card with the same data-defining
settings it does record. :func:`identity_differences` is the one comparison.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

from hs_dataset.formats.metadata import DatasetMetadata

__all__ = [
    "IDENTITY_FIELDS",
    "LEGACY_IDENTITY_KEYS",
    "STORAGE_FIELD",
    "describe_differences",
    "identity_differences",
    "identity_fields",
    "identity_fingerprint",
    "identity_with_storage",
    "legacy_identity_fingerprint",
]

STORAGE_FIELD = "shards.storage"
_ABSENT = object()  # a key the stored metadata does not record (an older manifest)
_Getter = Callable[[Mapping[str, Any]], Any]


def _at(*path: str) -> _Getter:
    """The value at ``path`` in the metadata's JSON form; a null on the way is null, a missing key absent."""

    def get(metadata: Mapping[str, Any]) -> Any:
        value: Any = metadata
        for key in path:
            if value is None:
                return None
            if not isinstance(value, Mapping) or key not in value:
                return _ABSENT
            value = value[key]
        return value

    return get


_REGENERATION_SETTINGS = ("max_new_tokens", "temperature", "top_p", "seed", "stop_token_ids", "thinking", "turns", "policy")


def _regeneration(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Whether turns were regenerated and with which settings (no record: not regenerated, as every manifest says)."""
    record = metadata.get("regeneration")
    if not isinstance(record, Mapping):
        return {"enabled": False}
    return {"enabled": True, **{key: record.get(key) for key in _REGENERATION_SETTINGS}}


_REGENERATE_ON = "regenerate.enabled"

# (field name as messages show it, how it is read off the metadata's JSON form); a mapping value is one group
# of fields ``name.key``. The one list of what defines a dataset's data.
IDENTITY_FIELDS: tuple[tuple[str, _Getter], ...] = (
    ("model.fingerprint", _at("model", "fingerprint")),
    ("tokenizer.fingerprint", _at("tokenizer", "fingerprint")),
    ("tokenizer.chat_template_sha256", _at("tokenizer", "chat_template_sha256")),
    ("layers.aux", _at("aux_layer_ids")),
    ("layers.convention", _at("layer_convention")),
    ("layers.final", _at("final_state")),
    ("dtype", _at("dtype")),
    ("hidden_size", _at("hidden_size")),
    ("max_length", _at("max_length")),
    ("overflow", _at("overflow")),
    ("source", _at("source")),
    ("limits", _at("limits")),
    ("regenerate", _regeneration),
)

# What the identity hashed before it was narrowed to the fields above (manifests written until then).
LEGACY_IDENTITY_KEYS = (
    "config_name",
    "config_fingerprint",
    "model",
    "aux_layer_ids",
    "layer_convention",
    "final_state",
    "dtype",
    "hidden_size",
)


def _json(metadata: DatasetMetadata | Mapping[str, Any]) -> Mapping[str, Any]:
    return metadata.to_json() if isinstance(metadata, DatasetMetadata) else metadata


def identity_fields(metadata: DatasetMetadata | Mapping[str, Any]) -> dict[str, Any]:
    """The identity as ``{field: value}`` (JSON values); fields the metadata does not record are left out."""
    raw = _json(metadata)
    fields: dict[str, Any] = {}
    for name, get in IDENTITY_FIELDS:
        value = get(raw)
        if value is _ABSENT:
            continue
        if isinstance(value, Mapping):
            fields.update({f"{name}.{key}": value[key] for key in sorted(value)})
        else:
            fields[name] = value
    return fields


def identity_with_storage(metadata: DatasetMetadata | Mapping[str, Any], encoding: str | None) -> dict[str, Any]:
    """:func:`identity_fields` and the state encoding the dataset stores (``shards.storage``): what a resume compares."""
    return {**identity_fields(metadata), STORAGE_FIELD: encoding}


def identity_fingerprint(metadata: DatasetMetadata | Mapping[str, Any]) -> str:
    """sha256 over :func:`identity_fields` (canonical JSON): the manifest's ``identity``."""
    return hashlib.sha256(json.dumps(identity_fields(metadata), sort_keys=True, default=str).encode()).hexdigest()


def legacy_identity_fingerprint(metadata: DatasetMetadata | Mapping[str, Any]) -> str:
    """The ``identity`` older manifests record: sha256 over LEGACY_IDENTITY_KEYS (the model by id and fingerprint)."""
    raw = _json(metadata)
    identity = {k: raw.get(k) for k in LEGACY_IDENTITY_KEYS}
    if isinstance(identity["model"], Mapping):
        identity["model"] = {k: identity["model"].get(k) for k in ("id", "fingerprint")}
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


def _group(name: str) -> str:
    """The field's group: ``source`` for ``source.split``; a plain field is its own group."""
    for group, _get in IDENTITY_FIELDS:
        if name == group or name.startswith(f"{group}."):
            return group
    return name


def identity_differences(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(field, stored value, wanted value)`` for each field that differs, of the groups both sides record."""
    both = {_group(k) for k in stored} & {_group(k) for k in wanted}
    names = sorted(k for k in set(stored) | set(wanted) if _group(k) in both)
    differences = [(k, stored.get(k), wanted.get(k)) for k in names if stored.get(k) != wanted.get(k)]
    if any(name == _REGENERATE_ON for name, _old, _new in differences):  # one side did not regenerate: its settings are moot
        differences = [d for d in differences if d[0] == _REGENERATE_ON or _group(d[0]) != "regenerate"]
    return differences


def _shown(value: Any) -> str:
    """A value as JSON, a long string (a hash) cut to its first 16 characters."""
    if isinstance(value, str) and len(value) > 40:
        value = f"{value[:16]}..."
    return json.dumps(value, ensure_ascii=False, default=str)


def describe_differences(differences: list[tuple[str, Any, Any]], stored: str = "stored", wanted: str = "card") -> str:
    """One line per differing field: ``layers.aux: [2, 30, 58] (stored) vs [2, 30, 57] (card)``."""
    return "\n".join(f"  {name}: {_shown(old)} ({stored}) vs {_shown(new)} ({wanted})" for name, old, new in differences)

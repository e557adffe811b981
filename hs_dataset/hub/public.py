"""What of a dataset's records may leave the machine, and the Hub metadata derived from them.

The local manifest keeps the model and tokenizer directories the capture read (so the
states can be recomputed here); on the Hub those paths mean nothing and leak the
machine's layout (``/root/.cache/...``). A pushed repo names the model by its id and
its weights fingerprint instead: :func:`public_manifest` rewrites a copy, and the card
is rendered from :func:`public_model`. The dataset identity covers the model's
fingerprint, never its id or path (``formats/identity.py``), so the copy's identity is
that of the local dataset; it is recomputed all the same, since the identity an older
manifest records also covered the model's id, which a push may fill in from the card.
:func:`public_run_report` scrubs the run report the same way: nothing pushed names a
local path.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from hs_dataset.formats.metadata import DatasetMetadata, ModelRecord

if TYPE_CHECKING:
    from hs_dataset.formats.manifest import Manifest

__all__ = [
    "bigger_size_category",
    "hub_model_id",
    "is_local_path",
    "model_id",
    "public_manifest",
    "public_metadata",
    "public_model",
    "public_run_report",
    "size_category",
    "source_datasets",
]

# an absolute or home path of two or more components inside a text (not a URL's path: that follows a host)
_PATH_IN_TEXT_RE = re.compile(r"(?<![\w:/.~-])~?/(?:[\w.@+-]+/)+[\w.@+-]*")
LOCAL = "<local>"  # what a local path is replaced by in a pushed record
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# huggingface.co's size_categories, smallest first (the dataset card's YAML validator knows these)
_SIZE_CATEGORIES = (
    (1_000, "n<1K"),
    (10_000, "1K<n<10K"),
    (100_000, "10K<n<100K"),
    (1_000_000, "100K<n<1M"),
    (10_000_000, "1M<n<10M"),
    (100_000_000, "10M<n<100M"),
    (1_000_000_000, "100M<n<1B"),
)


def is_local_path(value: Any) -> bool:
    """A string that names a place on this machine (absolute, home- or dot-relative), not an id."""
    return isinstance(value, str) and (os.path.isabs(value) or value.startswith(("~", "./", "../", "file:")))


def model_id(metadata: DatasetMetadata, card_model_path: str | None = None) -> str | None:
    """The model's public name: the manifest's ``model.id``, else the config card's model path when it is an id."""
    model = metadata.model or ModelRecord()
    if model.id:
        return str(model.id)
    path = model.path if not is_local_path(model.path) else card_model_path
    return str(path) if path and not is_local_path(path) else None


def hub_model_id(name: str | None) -> str | None:
    """``name`` when it is a Hub repo id (``owner/name``), the only kind the card's ``base_model`` accepts."""
    return name if name and _HUB_ID_RE.match(name) else None


def public_model(metadata: DatasetMetadata, card_model_path: str | None = None) -> ModelRecord:
    """``metadata.model`` without its local path; ``id`` filled in where the config card names it."""
    model = metadata.model or ModelRecord(json_keys=())
    if is_local_path(model.path):
        model = model.without("path")
    return replace(model, id=model_id(metadata, card_model_path))


def _replace_paths(value: str, local: dict[str, str]) -> str:
    for path, name in local.items():
        value = value.replace(path, name)
    return value


def public_metadata(metadata: DatasetMetadata, card_model_path: str | None = None) -> DatasetMetadata:
    """A copy of ``metadata`` with no local model or tokenizer directory in it.

    ``model.path`` and ``tokenizer.path`` are dropped (``model.id`` is set where known);
    the same paths anywhere else (backend settings, server flags) become the model's
    id, or ``model:<fingerprint prefix>`` when it has none.
    """
    model, tokenizer = metadata.model, metadata.tokenizer
    name = model_id(metadata, card_model_path) or f"model:{str((model.fingerprint if model else None) or 'unknown')[:16]}"
    local: dict[str, str] = {}
    for path in (model.path if model else None, tokenizer.path if tokenizer else None):
        if path is not None and is_local_path(path):
            local[os.path.normpath(path)] = name
            local[path] = name
    if model is not None and is_local_path(model.path):
        model = model.without("path")
    if tokenizer is not None and is_local_path(tokenizer.path):
        tokenizer = tokenizer.without("path")
    if model is not None and (local or "id" in (model.json_keys or ())):  # unchanged when nothing was local
        model = replace(model, id=model_id(metadata, card_model_path))
    ordered = dict(sorted(local.items(), key=lambda kv: -len(kv[0])))  # longest first: no half-replaced paths
    return replace(metadata, model=model, tokenizer=tokenizer).with_strings(lambda text: _replace_paths(text, ordered))


def public_manifest(manifest: Manifest, card_model_path: str | None = None) -> bytes:
    """The manifest JSON a push uploads: ``manifest`` with :func:`public_metadata`, its build record without the
    local command and directory; every other field unchanged."""
    from hs_dataset.formats.identity import identity_fingerprint

    metadata = public_metadata(manifest.metadata, card_model_path)
    # the build's command and directory are this machine's (paths, a user name): the state and count travel alone
    build = None if manifest.build is None else replace(manifest.build, command=None, cwd=None)
    # an older manifest's identity covered the model id a push may fill in: readers recompute it
    public = replace(manifest, metadata=metadata, identity=identity_fingerprint(metadata), shards=list(manifest.shards), build=build)
    return public.encode(sort_keys=True)


def size_category(samples: int) -> str:
    """The Hub ``size_categories`` value for a number of rows."""
    return next((name for bound, name in _SIZE_CATEGORIES if samples < bound), "n>1B")


def bigger_size_category(a: str | None, b: str) -> str:
    """The larger of two size categories (a repo holds several configs: the card states the largest)."""
    order = [name for _, name in _SIZE_CATEGORIES] + ["n>1B"]
    return b if a not in order or order.index(b) >= order.index(a) else a


def source_datasets(*sources: str | None) -> list[str]:
    """Hub ``source_datasets``: ``hf:owner/name`` sources by id; local or bundled conversations are ``original``."""
    ids = sorted({s[len("hf:") :].split(":")[0] for s in sources if isinstance(s, str) and s.startswith("hf:")})
    return ids or ["original"]


def public_run_report(raw: Any, local_paths: list[str]) -> bytes:
    """The ``run_report.json`` a push uploads: no ``out_dir``, no local path in any value.

    ``local_paths`` are the places known to be on this machine (the dataset root, the
    model and tokenizer directories); any other absolute or home path in a text (an
    issue's reason naming a file) is replaced as well.
    """
    known = sorted({p for path in local_paths if path for p in (str(path), os.path.normpath(str(path)))}, key=len, reverse=True)

    def scrub(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: scrub(v) for k, v in value.items() if k != "out_dir"}
        if isinstance(value, list):
            return [scrub(v) for v in value]
        if isinstance(value, str):
            if is_local_path(value):
                return LOCAL
            for path in known:
                value = value.replace(path, LOCAL)
            return _PATH_IN_TEXT_RE.sub(LOCAL, value)
        return value

    return (json.dumps(scrub(raw), indent=1) + "\n").encode()

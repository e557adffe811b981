"""Where a model lives and a cheap, stable fingerprint of its weights."""

from __future__ import annotations

import hashlib
import json
import os
import re
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from hs_dataset.errors import CaptureError
from hs_dataset.model.model_config import load_text_config

__all__ = [
    "BUILTIN_GROUP",
    "BUILTIN_PREFIX",
    "ModelPathError",
    "builtin_models",
    "download_command",
    "model_fingerprint",
    "read_final_norm",
    "resolve_model_path",
]

BUILTIN_PREFIX = "builtin:"
BUILTIN_GROUP = "hs_dataset.builtin_models"
_FULL_HASH_LIMIT = 2 * 1024**3  # hash every weight byte below this; above, hash the index and sizes


class ModelPathError(CaptureError, FileNotFoundError):
    """The model path names no local snapshot (or an unknown builtin model)."""


def builtin_models() -> dict[str, EntryPoint]:
    """Models registered under ``builtin:NAME`` (entry point group ``hs_dataset.builtin_models``).

    A registry instead of an import keeps test fixtures (the tiny model lives in
    :mod:`hs_dataset.demo`) out of the production import graph.
    """
    return {ep.name: ep for ep in entry_points(group=BUILTIN_GROUP)}


def resolve_model_path(path: str | None, *, revision: str | None = None) -> Path:
    """The one model resolver: a card's model path -> a local directory holding config.json.

    ``builtin:NAME`` models are built (and cached) on first use. A Hub id
    (``org/name``) resolves to its snapshot in the local Hugging Face cache, offline.
    Anything else must already be on disk: hs_dataset never downloads weights at run time.
    """
    if not path:
        raise ModelPathError("no model path: set model.path in the card or pass --model-path (or HS_DATASET_MODEL_PATH)")
    if path.startswith(BUILTIN_PREFIX):
        name = path[len(BUILTIN_PREFIX) :]
        known = builtin_models()
        if name not in known:
            raise ModelPathError(
                f"unknown builtin model {path!r}; known: {', '.join(BUILTIN_PREFIX + n for n in sorted(known)) or 'none (reinstall hs_dataset)'}"
            )
        return Path(known[name].load()()).resolve()
    local = Path(path).expanduser()
    if (local / "config.json").is_file():
        return local.resolve()
    if not local.exists() and _REPO_ID.fullmatch(path):
        return _cached_snapshot(path, revision)
    raise ModelPathError(
        f"model directory {path!r} has no config.json; hs_dataset never downloads weights at run time: "
        f"download the snapshot first ({download_command(path, revision)}) and pass its local path or its Hub id"
    )


_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def download_command(repo_id: str, revision: str | None = None) -> str:
    """The command of the installed huggingface_hub that fetches ``repo_id`` into the local cache."""
    shown = repo_id if _REPO_ID.fullmatch(repo_id) else "ORG/NAME"
    return f"hf download {shown}" + (f" --revision {revision}" if revision else "")


def _cached_snapshot(repo_id: str, revision: str | None) -> Path:
    """``org/name`` -> its snapshot in the local Hugging Face cache (no network), or how to download it."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        found = Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, ValueError):
        found = None
    if found is None or not (found / "config.json").is_file():
        raise ModelPathError(
            f"model {repo_id!r} is not a local directory and not in the local Hugging Face cache; hs_dataset never "
            f"downloads weights at run time: run `{download_command(repo_id, revision)}` first"
        )
    return found.resolve()


def model_fingerprint(directory: str | os.PathLike) -> str:
    """sha256 over config.json and the weights (every byte for small models; index + sizes for large ones)."""
    directory = Path(directory)
    digest = hashlib.sha256()
    digest.update((directory / "config.json").read_bytes())
    weights = sorted(p for p in directory.iterdir() if p.suffix == ".safetensors")
    total = sum(p.stat().st_size for p in weights)
    for path in weights:
        digest.update(path.name.encode())
        if total <= _FULL_HASH_LIMIT:
            with open(path, "rb") as f:
                while chunk := f.read(8 * 1024 * 1024):
                    digest.update(chunk)
        else:
            digest.update(str(path.stat().st_size).encode())
    index = directory / "model.safetensors.index.json"
    if index.exists():
        digest.update(index.read_bytes())
    return digest.hexdigest()


def read_final_norm(directory: str | os.PathLike, key_suffix: str = "model.norm.weight") -> tuple[object, float]:
    """Read the final norm weight and eps from a checkpoint without loading the model."""
    import torch
    from safetensors import safe_open

    directory = Path(directory)
    eps = float(load_text_config(directory).get("rms_norm_eps", 1e-6))
    index = directory / "model.safetensors.index.json"
    files = sorted(directory.glob("*.safetensors"))
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        names = [k for k in weight_map if k.endswith(key_suffix)]
        files = [directory / weight_map[names[0]]] if names else files
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                if name.endswith(key_suffix) and "layers." not in name:
                    return f.get_tensor(name).to(torch.float32), eps
    raise KeyError(f"{directory}: no tensor ending in {key_suffix!r} (the final norm weight)")

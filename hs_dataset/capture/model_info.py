"""Where a model lives and a cheap, stable fingerprint of its weights."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

__all__ = ["BUILTIN_PREFIX", "resolve_model_path", "model_fingerprint", "read_final_norm"]

BUILTIN_PREFIX = "builtin:"
_FULL_HASH_LIMIT = 2 * 1024**3  # hash every weight byte below this; above, hash the index and sizes


def resolve_model_path(path: str) -> Path:
    """Turn a card's model path into a local directory (``builtin:`` models are built on first use)."""
    if path.startswith(BUILTIN_PREFIX):
        name = path[len(BUILTIN_PREFIX) :]
        if name != "tiny-deepseek-v3":
            raise ValueError(f"unknown builtin model {name!r}; the only one is builtin:tiny-deepseek-v3")
        from hs_dataset.capture.tiny_model import build_tiny_deepseek

        return build_tiny_deepseek()
    local = Path(path).expanduser()
    if not (local / "config.json").exists():
        raise FileNotFoundError(
            f"model directory {path!r} has no config.json; hs_dataset never downloads weights at run time: "
            "download the snapshot first (huggingface-cli download ...) and pass its local path"
        )
    return local


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
    config = json.loads((directory / "config.json").read_text())
    text = config.get("text_config") or config
    eps = float(text.get("rms_norm_eps", 1e-6))
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

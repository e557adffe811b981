"""Load a pushed config back, verified: ``open_pushed(repo_or_dir, config)``.

:func:`download_pushed` downloads ``<config>/`` (or reads an already downloaded copy)
and checks every shard's hash (BLAKE3, or sha256 for format 1) and the norm weight's
sha256 against the manifest; :func:`open_pushed` then loads the index with
``datasets.load_dataset(dir, config)`` and returns it with
:class:`hs_dataset.formats.index.ShardTransform` set, so rows carry the tensors.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hs_dataset.errors import IntegrityError, UsageError
from hs_dataset.hub.front_matter import configs_of
from hs_dataset.hub.layout import README, REPO_TYPE, SHARDS_FOLDER

__all__ = ["download_pushed", "open_pushed"]


def download_pushed(
    repo_or_dir: str | os.PathLike,
    config: str | None = None,
    *,
    api: Any = None,
    token: str | bool | None = None,
    revision: str | None = None,
    local_dir: str | os.PathLike | None = None,
) -> tuple[Path, str]:
    """Download ``README.md`` and ``<config>/`` (unless ``repo_or_dir`` is a local copy) and
    verify every shard's hash and the norm weight's sha256 against the manifest.

    Returns (the local repo root, the config). Raises
    :class:`hs_dataset.errors.IntegrityError` on any mismatch.
    """
    from hs_dataset.formats.reader import open_dataset

    candidate = Path(repo_or_dir)
    if candidate.is_dir():
        root = candidate
    else:
        from huggingface_hub import HfApi

        api = api if api is not None else HfApi(token=token)
        repo_id = str(repo_or_dir)
        if config is None:
            readme = api.hf_hub_download(repo_id, README, repo_type=REPO_TYPE, revision=revision)
            config = _only_config(Path(readme).read_text(encoding="utf-8"), repo_id)
        root = Path(
            api.snapshot_download(
                repo_id,
                repo_type=REPO_TYPE,
                revision=revision,
                local_dir=local_dir,
                allow_patterns=[README, f"{config}/*"],
            )
        )
    if config is None:
        config = _only_config((root / README).read_text(encoding="utf-8"), str(root))
    shards_dir = root / config / SHARDS_FOLDER
    data = open_dataset(shards_dir, verify_hashes=True)
    for i in range(len(data.manifest.shards)):
        data.shard(i)  # size, header, structure and hash against the manifest
    if data.manifest.metadata.final_norm is not None and data.manifest.metadata.final_norm.weight_file:
        data.final_norm()  # sha256 of the weight file against the manifest
    return root, config


def _only_config(readme_text: str, where: str) -> str:
    names = configs_of(readme_text)
    if len(names) != 1:
        raise UsageError(f"{where} has configs {names}; pass config=")
    return names[0]


def open_pushed(
    repo_or_dir: str | os.PathLike,
    config: str | None = None,
    *,
    api: Any = None,
    token: str | bool | None = None,
    revision: str | None = None,
    local_dir: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
):
    """A pushed config as a ``datasets.Dataset`` whose rows carry the tensors.

    Downloads and verifies (:func:`download_pushed`), loads the index with
    ``datasets.load_dataset(<local copy>, config, split="train")`` (the card's
    ``configs:``), checks it against the manifest, and sets
    :class:`hs_dataset.formats.index.ShardTransform` on it.
    """
    import datasets

    from hs_dataset.formats.index import ShardTransform
    from hs_dataset.formats.manifest import Manifest

    root, config = download_pushed(repo_or_dir, config, api=api, token=token, revision=revision, local_dir=local_dir)
    shards_dir = root / config / SHARDS_FOLDER
    index = datasets.load_dataset(str(root), config, split="train", cache_dir=None if cache_dir is None else str(cache_dir))
    manifest = Manifest.load(shards_dir)
    if len(index) != manifest.num_samples:
        raise IntegrityError(f"{root}/{config}: the index has {len(index)} rows, the manifest {manifest.num_samples} samples")
    known = {(r.file, r.content_hash) for r in manifest.shards}
    seen = set(zip(index["shard_file"], index["shard_sha256"]))
    if not seen <= known:
        raise IntegrityError(f"{root}/{config}: index rows point to shards the manifest does not list: {sorted(seen - known)[:3]}")
    index.set_transform(ShardTransform(str(shards_dir)))
    return index

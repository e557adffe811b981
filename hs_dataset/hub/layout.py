"""Where a push puts a config in a dataset repo, one folder per config::

    README.md                               dataset card (YAML `configs:` + `dataset_info:`)
    <config>/train-00000-of-0000N.parquet   the index rows (INDEX_FEATURES), as datasets.push_to_hub lays them out
    <config>/hs_shards/manifest.json        the dataset directory, unchanged: manifest,
    <config>/hs_shards/shard-*.safetensors  shards (their sha256 is their LFS oid),
    <config>/hs_shards/final_norm.safetensors  norm weight, run_report.json
    <config>/figures/*.png                  lengths and per-layer statistics (hs_dataset.formats.stats)

so ``datasets.load_dataset(repo, config)`` loads the index and
``hs_dataset.open_dataset(<download>/<config>/hs_shards)`` reads the tensors. The upload
(:mod:`hs_dataset.hub.upload`) and the download (:mod:`hs_dataset.hub.download`) share these names.
"""

from __future__ import annotations

__all__ = ["FIGURES_FOLDER", "README", "REPO_TYPE", "SHARDS_FOLDER"]

REPO_TYPE = "dataset"
SHARDS_FOLDER = "hs_shards"
FIGURES_FOLDER = "figures"
README = "README.md"

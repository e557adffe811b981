"""The one Arrow index of a dataset directory: one light row per sample, tensors stay in the shards.

Its ``input_ids``, ``loss_mask`` (int64) and ``seq_len`` are the columns speculators'
``prepare-data`` writes, so an index is also speculators' Arrow dataset (the
hs_dataset backend for speculators trains from it; the Hub's viewer shows them).

The Hub push (hs_dataset.hub.upload) publishes these rows as parquet next to the
shards; :class:`ShardTransform` turns index rows back into rows that carry zero-copy
state tensors, read with the one shard reader. Imported on demand only: it needs
``datasets`` (the features), which ``import hs_dataset.formats`` must not pay for.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import datasets
import torch

from hs_dataset.errors import IntegrityError
from hs_dataset.formats.reader import HiddenStateDataset, open_dataset

__all__ = ["INDEX_FEATURES", "ShardTransform", "index_rows"]

INDEX_FEATURES = datasets.Features(
    {
        "sample_id": datasets.Value("string"),
        "input_ids": datasets.Sequence(datasets.Value("int64")),
        "loss_mask": datasets.Sequence(datasets.Value("int64")),  # int64 0/1, as speculators' prepare-data writes it
        "seq_len": datasets.Value("int64"),
        "num_supervised": datasets.Value("int64"),
        "shard_file": datasets.Value("string"),
        "index_in_shard": datasets.Value("int64"),
        "shard_sha256": datasets.Value("string"),
    }
)


def index_rows(dataset: HiddenStateDataset) -> Iterator[dict[str, Any]]:
    """Index rows in manifest order; ``shard_file`` is relative to the dataset directory."""
    for shard_index, record in enumerate(dataset.manifest.shards):
        reader = dataset.shard(shard_index)
        input_ids = reader.tensor("input_ids")
        loss_mask = reader.tensor("loss_mask")
        for i, sid in enumerate(reader.sample_ids):
            begin, end = reader.token_range(i)
            yield {
                "sample_id": sid,
                "input_ids": input_ids[begin:end].numpy(),
                "loss_mask": loss_mask[begin:end].to(torch.int64).numpy(),
                "seq_len": end - begin,
                "num_supervised": int(loss_mask[begin:end].sum()),
                "shard_file": record.file,
                "index_in_shard": i,
                "shard_sha256": record.content_hash,  # sha256 hex for format-1 shards, "blake3:<hex>" since format 2
            }


class ShardTransform:
    """``datasets`` transform: index rows in, rows with zero-copy state tensors out.

    Picklable (just a path); each process opens the shards it touches, and the
    shard hash in the row must equal the manifest's, so a row never reads the wrong bytes.
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self._dataset: HiddenStateDataset | None = None
        self._by_file: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"])

    def _open(self) -> HiddenStateDataset:
        if self._dataset is None:
            self._dataset = open_dataset(self.root)
            self._by_file = {record.file: i for i, record in enumerate(self._dataset.manifest.shards)}
        return self._dataset

    def _sample(self, file: str, index: int, sha: str, sid: str) -> dict[str, Any]:
        ds = self._open()
        shard_index = self._by_file.get(file)
        if shard_index is None or ds.manifest.shards[shard_index].content_hash != sha:
            raise IntegrityError(
                f"{self.root}: row {sid!r} points to shard {file!r} with hash {sha[:19]}..., which the manifest does not list"
            )
        item = ds.shard(shard_index).sample(index)
        if item["sample_id"] != sid:
            raise IntegrityError(f"{self.root}/{file}: row {index} holds {item['sample_id']!r}, the index says {sid!r}")
        return item

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        out: dict[str, list] = {key: list(values) for key, values in batch.items()}
        keys = ("input_ids", "loss_mask", "aux_hidden_states", "final_hidden_state")
        columns: dict[str, list] = {key: [] for key in keys}
        for file, index, sha, sid in zip(batch["shard_file"], batch["index_in_shard"], batch["shard_sha256"], batch["sample_id"]):
            item = self._sample(file, index, sha, sid)
            for key in keys:
                columns[key].append(item[key])
        out.update(columns)
        return out

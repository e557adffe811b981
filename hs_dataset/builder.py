"""A thin Hugging Face ``datasets`` builder over the capture pipeline.

The generation step runs :func:`hs_dataset.pipeline.build_dataset` into a persistent
work directory (``<cache_dir>/hs_dataset_work/<config id>/``), so an interrupted
build resumes instead of restarting (datasets deletes its own ``.incomplete``
directory on failure). It then yields lightweight index rows (ids, tokens, where
each sample lives); the shards are hard-linked next to the Arrow files, and the
tensors reach users through a transform that reads them with the one shard reader.

``num_proc=N`` splits the source deterministically into N parts (one backend and one
writer per process); the parts are merged into one manifest afterwards.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Iterator

import datasets

from hs_dataset.config import Card, list_cards, load_card

__all__ = ["HsDatasetConfig", "HsDataset", "ShardTransform", "load_dataset", "builder_module", "INDEX_FEATURES", "SHARDS_DIR"]

SHARDS_DIR = "hs_shards"
WORK_DIR_NAME = "hs_dataset_work"

INDEX_FEATURES = datasets.Features(
    {
        "sample_id": datasets.Value("string"),
        "input_ids": datasets.Sequence(datasets.Value("int64")),
        "seq_len": datasets.Value("int64"),
        "num_supervised": datasets.Value("int64"),
        "shard_file": datasets.Value("string"),
        "index_in_shard": datasets.Value("int64"),
        "shard_sha256": datasets.Value("string"),
    }
)


class HsDatasetConfig(datasets.BuilderConfig):
    """One card plus run options (which do not change what a sample contains)."""

    def __init__(
        self,
        *,
        card: Card | None = None,
        num_samples: int | None = None,
        source: str | None = None,
        model_path: str | None = None,
        servers: list[str] | None = None,
        batch_size: int | None = None,
        device: str | None = None,
        work_dir: str | None = None,
        shard_bytes: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.card = card
        self.num_samples = num_samples
        self.source = source
        self.model_path = model_path
        self.servers = servers
        self.batch_size = batch_size
        self.device = device
        self.work_dir = work_dir
        self.shard_bytes = shard_bytes


class HsDataset(datasets.GeneratorBasedBuilder):
    """``load_dataset("hs_dataset", config="kimi-k25-sglang")`` (after ``import hs_dataset``)."""

    BUILDER_CONFIG_CLASS = HsDatasetConfig
    BUILDER_CONFIGS = [HsDatasetConfig(name=name, card=load_card(name), version=datasets.Version("1.0.0")) for name in list_cards()]
    DEFAULT_CONFIG_NAME = "tiny-deepseek-hf"

    def __init__(self, *args: Any, config: str | None = None, **kwargs: Any) -> None:
        if config is not None:
            named = kwargs.get("config_name")
            if named is not None and named != config:
                raise ValueError(f"config={config!r} and name={named!r} disagree; pass one of them")
            kwargs["config_name"] = config
        kwargs.setdefault("dataset_name", "hs_dataset")
        super().__init__(*args, **kwargs)

    @property
    def card(self) -> Card:
        return self.config.card or load_card(self.config.name)

    def _info(self) -> datasets.DatasetInfo:
        return datasets.DatasetInfo(description=self.card.description, features=INDEX_FEATURES)

    # -------------------------------------------------------------- generation
    def _download_and_prepare(self, dl_manager: Any, verification_mode: Any, **prepare_split_kwargs: Any) -> None:
        self._num_parts = max(1, int(prepare_split_kwargs.get("num_proc") or 1))
        super()._download_and_prepare(dl_manager, verification_mode, **prepare_split_kwargs)
        self._link_shards()

    def _work_dir(self) -> Path:
        if self.config.work_dir:
            return Path(self.config.work_dir)
        return Path(self._cache_dir_root) / WORK_DIR_NAME / self.config_id

    def _split_generators(self, dl_manager: Any) -> list[datasets.SplitGenerator]:
        parts = getattr(self, "_num_parts", 1)
        work = self._work_dir()
        return [
            datasets.SplitGenerator(
                name=datasets.Split.TRAIN,
                gen_kwargs={"part_dirs": [str(work / f"part-{p:05d}-of-{parts:05d}") for p in range(parts)], "num_parts": parts},
            )
        ]

    def _generate_examples(self, part_dirs: list[str], num_parts: int) -> Iterator[tuple[str, dict[str, Any]]]:
        from hs_dataset.formats.reader import open_dataset
        from hs_dataset.pipeline import build_dataset

        cfg = self.config
        for part_dir in part_dirs:
            rank = int(Path(part_dir).name.split("-")[1])
            kwargs = dict(
                num_samples=cfg.num_samples, source=cfg.source, batch_size=cfg.batch_size, model_path=cfg.model_path,
                device=cfg.device, servers=cfg.servers, rank=rank, world_size=num_parts, shard_bytes=cfg.shard_bytes,
            )
            if num_parts == 1:
                build_dataset(self.card, part_dir, **kwargs)
            else:
                _build_in_fresh_process(self.card, part_dir, kwargs)
            ds = open_dataset(part_dir)
            prefix = f"part-{rank:05d}"
            for shard_index, record in enumerate(ds.manifest.shards):
                reader = ds.shard(shard_index)
                for i, sid in enumerate(reader.sample_ids):
                    begin, end = reader.token_range(i)
                    yield sid, {
                        "sample_id": sid,
                        "input_ids": reader.tensor("input_ids")[begin:end].tolist(),
                        "seq_len": end - begin,
                        "num_supervised": int(reader.tensor("loss_mask")[begin:end].sum()),
                        "shard_file": f"{prefix}/{Path(record.file).name}",
                        "index_in_shard": i,
                        "shard_sha256": record.sha256,
                    }

    def _link_shards(self) -> None:
        """Merge the parts into ``<arrow dir>/hs_shards`` (hard links) next to the Arrow files."""
        from hs_dataset.formats.merge import merge_datasets

        work = self._work_dir()
        parts = sorted(str(p) for p in work.glob(f"part-*-of-{self._num_parts:05d}") if (p / "manifest.json").exists())
        target = Path(self._output_dir) / SHARDS_DIR
        merge_datasets(parts, target, check_ids=False)

    # -------------------------------------------------------------- reading
    def _as_dataset(self, split: Any = datasets.Split.TRAIN, in_memory: bool = False) -> datasets.Dataset:
        ds = super()._as_dataset(split=split, in_memory=in_memory)
        ds.set_transform(ShardTransform(str(Path(self._output_dir) / SHARDS_DIR)))
        return ds


def _build_in_fresh_process(card: Card, part_dir: str, kwargs: dict[str, Any]) -> None:
    """Run one part's capture in a fresh interpreter.

    ``num_proc`` workers are forked from a process whose torch thread pool may already
    be running; OpenMP does not survive a fork, so a forward pass in the fork can hang.
    The child gets its job as JSON on stdin (nothing is pickled).
    """
    import json
    import subprocess
    import sys

    job = json.dumps({"card": card.raw, "card_path": card.source_path, "part_dir": part_dir, "kwargs": kwargs})
    code = "from hs_dataset.builder import _build_part_from_stdin; _build_part_from_stdin()"
    done = subprocess.run([sys.executable, "-c", code], input=job, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"capture of {part_dir} failed (exit code {done.returncode}); rerun to resume it")


def _build_part_from_stdin() -> None:
    import json
    import sys

    from hs_dataset.config import card_from_dict
    from hs_dataset.pipeline import build_dataset

    job = json.loads(sys.stdin.read())
    build_dataset(card_from_dict(job["card"], job["card_path"]), job["part_dir"], **job["kwargs"])


class ShardTransform:
    """``datasets`` transform: index rows in, rows with zero-copy state tensors out.

    Picklable (just a path); each process opens the shards it touches, and the
    shard hash in the row must equal the manifest's, so a row never reads the wrong bytes.
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self._dataset = None
        self._by_file: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"])

    def _open(self):
        if self._dataset is None:
            from hs_dataset.formats.reader import open_dataset

            self._dataset = open_dataset(self.root)
            self._by_file = {record.file: i for i, record in enumerate(self._dataset.manifest.shards)}
        return self._dataset

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        import torch

        from hs_dataset.errors import IntegrityError

        ds = self._open()
        out: dict[str, list] = {key: list(values) for key, values in batch.items()}
        columns: dict[str, list] = {"input_ids": [], "loss_mask": [], "aux_hidden_states": [], "final_hidden_state": []}
        for file, index, sha, sid in zip(batch["shard_file"], batch["index_in_shard"], batch["shard_sha256"], batch["sample_id"]):
            shard_index = self._by_file.get(file)
            if shard_index is None or ds.manifest.shards[shard_index].sha256 != sha:
                raise IntegrityError(f"{self.root}: row {sid!r} points to shard {file!r} with sha256 {sha[:12]}..., which the manifest does not list")
            item = ds.shard(shard_index).sample(index)
            if item["sample_id"] != sid:
                raise IntegrityError(f"{self.root}/{file}: row {index} holds {item['sample_id']!r}, the index says {sid!r}")
            for key in columns:
                columns[key].append(item[key])
        out.update(columns)
        out["input_ids"] = [torch.as_tensor(x) for x in columns["input_ids"]]
        return out


# ------------------------------------------------------------------ entry points
def builder_module() -> Any:
    """The ``DatasetModule`` that ``datasets.load_dataset("hs_dataset")`` resolves to."""
    from datasets.load import DatasetModule

    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    return DatasetModule("hs_dataset.builder", digest, {"dataset_name": "hs_dataset"})


def load_dataset(config: str = HsDataset.DEFAULT_CONFIG_NAME, *, split: str | None = "train", num_proc: int | None = None, cache_dir: str | None = None, **config_kwargs: Any):
    """Build (or reuse) a config's dataset through ``datasets`` and return it with the shard transform.

    Same result as ``datasets.load_dataset("hs_dataset", config, ...)``, without
    relying on the name hook.
    """
    builder = HsDataset(config_name=config, cache_dir=cache_dir, hash=builder_module().hash, **config_kwargs)
    builder.download_and_prepare(num_proc=num_proc)
    return builder.as_dataset(split=split)


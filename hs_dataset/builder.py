"""The Hugging Face ``datasets`` builder over the capture pipeline (documented hooks only).

``_generate_tables`` runs or resumes :func:`hs_dataset.pipeline.build.build_dataset` into a
persistent work directory (``<cache_dir>/hs_dataset_work/<config id>/``: datasets
deletes its own ``.incomplete`` directory on failure, so shards that must survive a
crash live there), verifies it, and yields rows that carry the states. Arrow has no
bfloat16, so states are stored as float32 (exact for bf16/f32 data); the shards in the
work directory stay the zero-copy path (``hs_dataset.open_dataset``).

The config id (hence the cache directory and the work directory) is a digest of the
card, the model, the source's content and the run options, so an edited source or
another model builds again instead of returning stale rows.

``num_parts=N`` (``hs_dataset.load_dataset(num_proc=N)`` sets it) splits the source
deterministically into N parts, one capture process each; ``num_proc`` then writes
them in parallel.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import datasets
import numpy as np
import pyarrow as pa

from hs_dataset.config import Card, list_cards, load_card
from hs_dataset.config.run import RunOptions, parse_options
from hs_dataset.errors import HsDatasetError
from hs_dataset.formats.paths import check_local_path

__all__ = ["WORK_DIR_NAME", "HsDataset", "HsDatasetConfig", "builder_module", "load_dataset", "row_features"]

WORK_DIR_NAME = "hs_dataset_work"
TABLE_BYTES = 256 * 1024**2  # float32 state bytes per yielded Arrow table (bounds memory)
_BUILT_PREFIX = "hs_dataset-built: "  # the line a part's child process ends its stdout with (what it built)
_RUN_OPTIONS = ("num_samples", "batch_size", "num_parts", "shard_bytes", "device", "servers")


class HsDatasetConfig(datasets.BuilderConfig):
    """One card plus run options; :meth:`create_config_id` digests everything that changes the rows.

    The run options (``num_samples``, ``source``, ``batch_size``, ``model_path``, ``device``,
    ``servers``, ``shard_bytes``, ``storage``) are a validated
    :class:`~hs_dataset.config.run.RunOptions` in :attr:`options`, readable and settable as
    attributes too: ``datasets`` sets ``load_dataset``'s keywords on a copy of a shipped
    config one by one.
    """

    def __init__(self, *, card: Card | None = None, work_dir: str | None = None, num_parts: int | None = None, **kwargs: Any) -> None:
        run = {name: kwargs.pop(name) for name in list(kwargs) if name in RunOptions.model_fields}
        super().__init__(**kwargs)
        self.card = card
        self.work_dir = work_dir
        self.num_parts = num_parts
        self.options = parse_options(RunOptions, "hs_dataset.load_dataset()", run)

    def __getattr__(self, name: str) -> Any:
        options = self.__dict__.get("options")
        if options is not None and name in RunOptions.model_fields:
            return getattr(options, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in RunOptions.model_fields:
            self.options = parse_options(RunOptions, "hs_dataset.load_dataset()", {**self.options.settings(), name: value})
        else:
            if name == "work_dir" and value is not None:  # before any capture: the parts are written locally, shard by shard
                check_local_path(value, what="work_dir")
            super().__setattr__(name, value)

    def resolved_card(self) -> Card:
        return self.card or load_card(self.name)

    def model_dir(self) -> Path | None:
        """The local model directory the capture will use (None when it is not on this machine)."""
        from hs_dataset.model.snapshot import ModelPathError, resolve_model_path

        card = self.resolved_card()
        path = self.model_path or card.model.path or os.environ.get("HS_DATASET_MODEL_PATH")
        try:
            return resolve_model_path(path)
        except ModelPathError:
            return None

    def cache_key(self) -> str:
        """sha256 over the card, the model's weights, the source's content and the run options.

        With ``data_dir`` (an existing dataset served as rows): over its manifest's identity and
        shard hashes instead, so a dataset rewritten in place is read again.
        """
        from hs_dataset.model.snapshot import model_fingerprint

        if self.data_dir:
            manifest = served_manifest(self.data_dir)
            served = {
                "data_dir": str(self.data_dir),
                "dataset_id": manifest.dataset_id,
                "identity": manifest.identity,
                "shards": [(r.file, r.blake3 or r.sha256) for r in manifest.shards],
            }
            return hashlib.sha256(json.dumps(served, sort_keys=True).encode()).hexdigest()
        model = self.model_dir()
        parts = {
            "card": self.resolved_card().fingerprint,
            "model": model_fingerprint(model) if model is not None else self.model_path,
            "source": _source_identity(self.resolved_card(), self.source),
            "options": {name: getattr(self, name) for name in _RUN_OPTIONS},
        }
        if self.storage:  # digested only when set, so the keys of builds without it stay what they were
            parts["options"]["storage"] = self.storage
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()

    def create_config_id(self, config_kwargs: dict, custom_features: datasets.Features | None = None) -> str:
        """``<name>-<cache key>``: datasets' default id ignores the source's and the model's content."""
        suffix = self.cache_key()[:16]
        if custom_features is not None:
            suffix = hashlib.sha256((suffix + str(custom_features)).encode()).hexdigest()[:16]
        return f"{self.name}-{suffix}"


def _source_identity(card: Card, source: Any) -> Any:
    """What the source's rows depend on: path, size and mtime_ns of every file (or a datasets fingerprint)."""
    from hs_dataset.pipeline.session import resolve_source

    try:
        resolved = resolve_source(card, source)
    except ValueError:
        return None
    if not isinstance(resolved, (str, os.PathLike)):
        from datasets.fingerprint import Hasher

        return Hasher.hash(resolved)
    root = Path(resolved).expanduser()
    if not root.exists():
        return str(resolved)
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    return [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def served_manifest(data_dir: str) -> Any:
    """The manifest of the existing dataset ``data_dir`` names: a local directory or an fsspec URL (``s3://...``)."""
    from hs_dataset.dataset_access import read_manifest

    return read_manifest(data_dir)


def _hidden_size(model_dir: Path | None) -> int | None:
    from hs_dataset.model.model_config import load_text_config

    size = load_text_config(model_dir).get("hidden_size") if model_dir is not None else None
    return int(size) if size else None


def _num_aux(card: Card, model_dir: Path | None) -> int | None:
    """How many aux layers the card captures (a preset's count needs the model's layer count; None when it is not here)."""
    if card.layers.aux is not None:
        return len(card.layers.aux)
    if model_dir is None:
        return None
    from hs_dataset.capture.base import card_aux_layers

    return len(card_aux_layers(card, model_dir))


def row_features(num_aux: int | None, hidden: int | None) -> datasets.Features:
    """Row schema; states are float32 (Arrow has no bfloat16). Shapes show when the sizes are known.

    A dataset of the final state only (``num_aux`` 0) has no aux column: Arrow has no zero-width dimension.
    """
    f32 = datasets.Value("float32")
    known = hidden and num_aux is not None
    aux = datasets.Array3D((None, num_aux, hidden), "float32") if known else datasets.List(datasets.List(datasets.List(f32)))
    final = datasets.Array2D((None, hidden), "float32") if hidden else datasets.List(datasets.List(f32))
    columns = {
        "sample_id": datasets.Value("string"),
        "input_ids": datasets.List(datasets.Value("int64")),
        "loss_mask": datasets.List(datasets.Value("bool")),
        "seq_len": datasets.Value("int64"),
        "num_supervised": datasets.Value("int64"),
        "aux_hidden_states": aux,
        "final_hidden_state": final,
    }
    if num_aux == 0:
        del columns["aux_hidden_states"]
    return datasets.Features(columns)


class HsDataset(datasets.ArrowBasedBuilder):
    """``datasets.load_dataset("hs_dataset", config="kimi-k25-sglang")``."""

    BUILDER_CONFIG_CLASS = HsDatasetConfig
    BUILDER_CONFIGS: ClassVar[list[HsDatasetConfig]] = [
        HsDatasetConfig(name=name, card=load_card(name), version=datasets.Version("1.0.0")) for name in list_cards()
    ]
    DEFAULT_CONFIG_NAME = "tiny-deepseek-hf"

    def __init__(self, *args: Any, config: str | None = None, cache_dir: str | None = None, **kwargs: Any) -> None:
        if config is not None:
            named = kwargs.get("config_name")
            if named is not None and named != config:
                raise ValueError(f"config={config!r} and name={named!r} disagree; pass one of them")
            kwargs["config_name"] = config
        kwargs.setdefault("dataset_name", "hs_dataset")
        self.work_root = Path(os.path.expanduser(str(cache_dir or datasets.config.HF_DATASETS_CACHE))) / WORK_DIR_NAME
        self.created_in_pid = os.getpid()
        super().__init__(*args, cache_dir=cache_dir, **kwargs)

    @property
    def card(self) -> Card:
        return self.config.resolved_card()

    @property
    def work_dir(self) -> Path:
        """Where the shards live (one ``part-*`` dataset directory per part); open them with ``hs_dataset.open_dataset``."""
        return Path(self.config.work_dir) if self.config.work_dir else self.work_root / self.config_id

    def _info(self) -> datasets.DatasetInfo:
        if self.config.data_dir:  # an existing dataset, served as it is: its manifest says the shapes
            metadata = served_manifest(self.config.data_dir).metadata
            features = row_features(len(metadata.aux_layer_ids or ()), int(metadata.hidden_size or 0))
            return datasets.DatasetInfo(description=f"hs_dataset rows of {self.config.data_dir}", features=features)
        model_dir = self.config.model_dir()
        features = row_features(_num_aux(self.card, model_dir), _hidden_size(model_dir))
        return datasets.DatasetInfo(description=self.card.description, features=features)

    def _split_generators(self, dl_manager: Any) -> list[datasets.SplitGenerator]:
        if self.config.data_dir:
            return [
                datasets.SplitGenerator(
                    name=datasets.Split.TRAIN, gen_kwargs={"part_dirs": [], "num_parts": 1, "served": str(self.config.data_dir)}
                )
            ]
        parts = max(1, int(self.config.num_parts or 1))
        part_dirs = [str(self.work_dir / f"part-{p:05d}-of-{parts:05d}") for p in range(parts)]
        return [datasets.SplitGenerator(name=datasets.Split.TRAIN, gen_kwargs={"part_dirs": part_dirs, "num_parts": parts})]

    def _generate_tables(self, part_dirs: list[str], num_parts: int, served: str | None = None) -> Iterator[tuple[Any, pa.Table]]:
        from datasets.builder import Key

        from hs_dataset.formats.reader import open_dataset

        if served is not None:
            yield from self._served_tables(served)
            return
        shard_id = 0  # per job: datasets counts rows per original shard in a list
        with _fork_safe_torch(forked=os.getpid() != self.created_in_pid):
            for part_dir in part_dirs:
                rank = int(Path(part_dir).name.split("-")[1])
                built = self._capture(part_dir, rank, num_parts)
                data = open_dataset(part_dir)
                _check_served(data.manifest, built, part_dir)
                for shard_index in range(len(data.manifest.shards)):
                    for batch, table in enumerate(_shard_tables(data.shard(shard_index), self.info.features)):
                        yield Key(shard_id, batch), table
                    shard_id += 1

    def _served_tables(self, data_dir: str) -> Iterator[tuple[Any, pa.Table]]:
        """The rows of an existing dataset (``data_dir=``), every shard's hash checked before its rows are served.

        A URL reads through the bounded local cache (hashes checked on download); a local
        directory is verified shard by shard as it is read.
        """
        from datasets.builder import Key

        from hs_dataset.dataset_access import open_dataset as open_any

        data = open_any(data_dir, verify_hashes=True)
        try:
            for shard_index in range(len(data.manifest.shards)):
                for batch, table in enumerate(_shard_tables(data.shard(shard_index), self.info.features)):
                    yield Key(shard_index, batch), table
        finally:
            getattr(data, "close", lambda: None)()

    def _capture(self, part_dir: str, rank: int, num_parts: int) -> dict[str, Any]:
        """Run or resume one part's capture, then verify every hash, shape and value of it; returns what it built."""
        from hs_dataset.errors import IntegrityError
        from hs_dataset.formats.verify import verify_dataset

        kwargs = {
            **self.config.options.settings(),
            "rank": rank,
            "world_size": num_parts,
            "progress": datasets.utils.is_progress_bar_enabled(),
        }
        if num_parts == 1:
            from hs_dataset.pipeline.build import build_dataset

            built = _built(build_dataset(self.card, part_dir, **kwargs).to_json())
        else:
            built = _build_in_fresh_process(self.card, part_dir, kwargs)
        result = verify_dataset(part_dir)
        if not result.ok:
            raise IntegrityError(f"{part_dir}: verification failed: " + "; ".join(result.problems))
        return built


def _built(report: dict[str, Any]) -> dict[str, Any]:
    """What a part's build says it wrote into: the dataset, its identity, and how many samples it was asked for."""
    return {key: report.get(key) for key in ("dataset_id", "identity", "samples_considered")}


def _check_served(manifest: Any, built: dict[str, Any], part_dir: str) -> None:
    """The rows served come from the dataset this load built, and are never more than it asked for.

    The work directory persists between loads: another build writing into it (or
    replacing it) would otherwise be served as this load's rows.
    """
    from hs_dataset.errors import IntegrityError

    fix = f"delete {part_dir} (or the whole work directory) to build it again"
    if manifest.dataset_id != built["dataset_id"] or manifest.identity != built["identity"]:
        raise IntegrityError(
            f"{part_dir}: holds dataset {manifest.dataset_id} (identity {manifest.identity[:12]}...), not the "
            f"{built['dataset_id']} (identity {str(built['identity'])[:12]}...) this load built: another build replaced it; {fix}"
        )
    asked = int(built["samples_considered"] or 0)
    if manifest.num_samples > asked:
        raise IntegrityError(
            f"{part_dir}: holds {manifest.num_samples} samples but this load asked for {asked}: another build wrote rows into "
            f"the work directory; {fix}"
        )


@contextlib.contextmanager
def _fork_safe_torch(forked: bool) -> Iterator[None]:
    """One torch thread in a ``num_proc`` worker: OpenMP's pool does not survive a fork,
    so a parallel op (verify, bf16 -> float32) in a forked worker hangs forever."""
    if not forked:
        yield
        return
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _shard_tables(reader: Any, features: datasets.Features) -> Iterator[pa.Table]:
    """One shard's rows as Arrow tables of at most ~TABLE_BYTES of float32 states."""
    batch: list[dict[str, Any]] = []
    size = 0
    for i in range(len(reader)):
        sample = reader.sample(i)
        batch.append(sample)
        size += 4 * (sample["aux_hidden_states"].numel() + sample["final_hidden_state"].numel())
        if size >= TABLE_BYTES:
            yield _table(batch, features)
            batch, size = [], 0
    if batch:
        yield _table(batch, features)


def _table(samples: list[dict[str, Any]], features: datasets.Features) -> pa.Table:
    import torch

    lengths = np.array([len(s["input_ids"]) for s in samples], dtype=np.int64)
    mask = [s["loss_mask"] for s in samples]
    columns = {
        "sample_id": pa.array([s["sample_id"] for s in samples], pa.string()),
        "input_ids": _ragged(torch.cat([s["input_ids"] for s in samples]).numpy(), lengths),
        "loss_mask": _ragged(torch.cat(mask).numpy().astype(bool), lengths),
        "seq_len": pa.array(lengths),
        "num_supervised": pa.array([int(m.sum()) for m in mask], pa.int64()),
        "final_hidden_state": _ragged(torch.cat([s["final_hidden_state"].float() for s in samples]).numpy(), lengths),
    }
    if "aux_hidden_states" in features:  # not in a dataset of the final state only
        columns["aux_hidden_states"] = _ragged(torch.cat([s["aux_hidden_states"].float() for s in samples]).numpy(), lengths)
    schema = features.arrow_schema
    arrays = []
    for name in schema.names:
        wanted = schema.field(name).type
        array = columns[name]
        arrays.append(pa.ExtensionArray.from_storage(wanted, array) if isinstance(wanted, pa.ExtensionType) else array.cast(wanted))
    return pa.Table.from_arrays(arrays, schema=schema)


def _ragged(flat: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """``flat`` [sum(lengths), *inner] as nested Arrow lists, one outer list per sample (no Python loop over values)."""
    array: pa.Array = pa.array(np.ascontiguousarray(flat).reshape(-1))
    for dim in reversed(flat.shape[1:]):
        array = pa.ListArray.from_arrays(pa.array(np.arange(0, len(array) + 1, dim, dtype=np.int32)), array)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), array)


def _build_in_fresh_process(card: Card, part_dir: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Run one part's capture in a fresh interpreter.

    ``num_proc`` workers are forked from a process whose torch thread pool may already
    be running; OpenMP does not survive a fork, so a forward pass in the fork can hang.
    The child gets its job as JSON on stdin (nothing is pickled).
    """
    import subprocess
    import sys

    job = json.dumps({"card": card.to_dict(), "card_path": card.source_path, "part_dir": part_dir, "kwargs": kwargs}, default=str)
    code = "from hs_dataset.builder import _build_part_from_stdin; _build_part_from_stdin()"
    done = subprocess.run([sys.executable, "-c", code], input=job, text=True, stdout=subprocess.PIPE)
    if done.returncode != 0:
        raise RuntimeError(f"capture of {part_dir} failed (exit code {done.returncode}); rerun to resume it")
    lines = [line for line in done.stdout.splitlines() if line.startswith(_BUILT_PREFIX)]
    if not lines:
        raise RuntimeError(f"capture of {part_dir} said nothing of what it built; rerun to resume it")
    return json.loads(lines[-1][len(_BUILT_PREFIX) :])


def _build_part_from_stdin() -> None:
    import sys

    from hs_dataset.config import card_from_dict
    from hs_dataset.pipeline.build import build_dataset

    job = json.loads(sys.stdin.read())
    report = build_dataset(card_from_dict(job["card"], job["card_path"]), job["part_dir"], **job["kwargs"])
    print(_BUILT_PREFIX + json.dumps(_built(report.to_json())), flush=True)


# ------------------------------------------------------------------ entry points
def builder_module() -> Any:
    """The ``DatasetModule`` that ``datasets.load_dataset("hs_dataset")`` resolves to (hash: this file)."""
    from datasets.load import DatasetModule

    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    return DatasetModule("hs_dataset.builder", digest, {"dataset_name": "hs_dataset"})


def load_dataset(
    config: str = HsDataset.DEFAULT_CONFIG_NAME,
    *,
    split: str | None = "train",
    num_proc: int | None = None,
    cache_dir: str | None = None,
    format: str | None = "torch",
    **config_kwargs: Any,
):
    """``datasets.load_dataset("hs_dataset", config, ...)`` without the name hook, rows as torch tensors.

    ``num_proc=N`` also captures in N parts (``num_parts``) so the processes have work to share.
    """
    if num_proc and num_proc > 1:
        config_kwargs.setdefault("num_parts", num_proc)
    builder = HsDataset(config_name=config, cache_dir=cache_dir, hash=builder_module().hash, **config_kwargs)
    try:
        builder.download_and_prepare(num_proc=num_proc)
    except datasets.exceptions.DatasetGenerationError as exc:
        if isinstance(exc.__cause__, HsDatasetError):  # our one-line refusal, not datasets' generic wrapper
            raise exc.__cause__ from None
        raise
    ds = builder.as_dataset(split=split)
    return ds.with_format(format) if format else ds

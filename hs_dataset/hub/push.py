"""Publish a dataset directory to the Hugging Face Hub, and load it back verified.

``push_to_hub(path, repo_id)`` uploads one of our dataset directories (manifest +
shards) into a dataset repository, one folder per config::

    README.md                               dataset card (YAML `configs:` + `dataset_info:`)
    <config>/train-00000-of-0000N.parquet   the index rows (INDEX_FEATURES), as datasets.push_to_hub lays them out
    <config>/hs_shards/manifest.json        the dataset directory, unchanged: manifest,
    <config>/hs_shards/shard-*.safetensors  shards (their sha256 is their LFS oid),
    <config>/hs_shards/final_norm.safetensors  norm weight, run_report.json
    <config>/figures/*.png                  lengths and per-layer statistics (hs_dataset.formats.stats)

so ``datasets.load_dataset(repo, config)`` loads the index and
``hs_dataset.open_dataset(<download>/<config>/hs_shards)`` reads the tensors.

The push is resumable and bounded:

* before uploading, the repo's file info under ``<config>/`` is listed once; every
  file whose remote LFS sha256 already equals the local one is skipped, so a second
  push uploads nothing. Format-2 manifests record BLAKE3, not sha256: the push
  computes a shard's sha256 when it needs it, in the same read that checks the
  shard's BLAKE3 against the manifest;
* shards go up in several commits of at most ``commit_bytes`` / ``commit_files``;
  each batch is uploaded first (``preupload_lfs_files``), the sha256 the client
  computed while uploading is compared with the one of the bytes checked against the
  manifest, and only then committed, so a corrupted local shard is never published;
* the manifest, index, figures and card go in one last commit, which also deletes
  files left under ``<config>/`` by an older push. Until that commit lands the repo
  shows the previous state: a manifest never lists a shard the repo lacks. An
  interrupted push (network, crash) is resumed by running it again; LFS objects
  uploaded by the interrupted run are not sent twice (the Hub deduplicates by oid).

``open_pushed(repo_or_dir, config)`` downloads ``<config>/`` (or reads an already
downloaded copy), checks every shard's hash (BLAKE3, or sha256 for format 1) and the
norm weight's sha256 against the manifest, loads the index with ``datasets.load_dataset(dir, config)`` and returns it
with :class:`hs_dataset.formats.index.ShardTransform` set, so rows carry the tensors.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from hs_dataset.errors import IntegrityError, UsageError
from hs_dataset.faults import crash_point
from hs_dataset.formats.hashing import file_digests
from hs_dataset.formats.paths import open_regular, resolve_member
from hs_dataset.hub.public import (
    bigger_size_category,
    hub_model_id,
    model_id,
    public_manifest,
    public_metadata,
    public_model,
    size_category,
    source_datasets,
)

__all__ = [
    "push_to_hub",
    "open_pushed",
    "download_pushed",
    "render_card",
    "write_index",
    "PushReport",
    "DEFAULT_COMMIT_BYTES",
    "DEFAULT_COMMIT_FILES",
]

logger = logging.getLogger(__name__)

REPO_TYPE = "dataset"
SHARDS_FOLDER = "hs_shards"
FIGURES_FOLDER = "figures"
README = "README.md"
DEFAULT_COMMIT_BYTES = 16 * 1024**3  # per shard commit
DEFAULT_COMMIT_FILES = 50  # per shard commit (the Hub prefers commits of tens of files)
DEFAULT_INDEX_FILE_BYTES = 500 * 1024**2  # datasets.push_to_hub's max_shard_size
_CONFIG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_MARK_BEGIN = "<!-- hs_dataset:begin {} -->"
_MARK_END = "<!-- hs_dataset:end {} -->"
_SECTION_RE = re.compile(r"<!-- hs_dataset:begin (?P<name>[^ ]+) -->.*?<!-- hs_dataset:end (?P=name) -->", re.S)


# ------------------------------------------------------------------------------- report
@dataclass
class PushReport:
    """What a push did. ``uploaded`` and ``skipped`` are repo paths."""

    repo_id: str
    config: str
    revision: str
    commits: list[str] = field(default_factory=list)
    uploaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    bytes_uploaded: int = 0

    def summary(self) -> str:
        return (
            f"pushed {self.config} to {self.repo_id}@{self.revision}: {len(self.uploaded)} file(s) "
            f"({self.bytes_uploaded / 2**20:.1f} MiB) in {len(self.commits)} commit(s), "
            f"{len(self.skipped)} already there, {len(self.deleted)} stale file(s) deleted"
        )


_MAX_RUN_REPORT_BYTES = 64 * 1024 * 1024


@dataclass
class _Local:
    local: Path
    repo_path: str
    size: int
    sha256: str | None = None  # known in advance for format-1 shards and the norm weight
    blake3: str | None = None  # the manifest's hash of a format-2 shard, checked in the read that computes sha256

    def digest(self) -> str:
        """sha256 (the LFS oid), computed on first use; a recorded BLAKE3 is checked in the same read."""
        if self.sha256 is None:
            with open_regular(self.local, what="dataset file") as f:
                digests = file_digests(f, ("sha256", "blake3") if self.blake3 else ("sha256",))
            if self.blake3 and digests["blake3"] != self.blake3:
                raise IntegrityError(
                    f"{self.local}: blake3 {digests['blake3']} != manifest {self.blake3}; not published (corrupted shard: restore it or rebuild it)"
                )
            self.sha256 = digests["sha256"]
        return self.sha256


@dataclass
class _Remote:
    size: int
    blob_id: str | None
    lfs_sha256: str | None


def _git_blob_sha1(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _same(local: _Local, remote: _Remote | None) -> bool:
    """True when the remote file holds exactly the local bytes."""
    if remote is None or remote.size != local.size:
        return False
    if remote.lfs_sha256 is not None:
        return remote.lfs_sha256 == local.digest()
    return remote.blob_id is not None and remote.blob_id == _git_blob_sha1(local.local)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


# ------------------------------------------------------------------------------- index
def write_index(dataset: Any, out_dir: Path, *, max_file_bytes: int = DEFAULT_INDEX_FILE_BYTES) -> tuple[list[Path], int, int]:
    """Write the index rows of ``dataset`` as ``train-NNNNN-of-NNNNN.parquet`` files.

    Rows are those of :func:`hs_dataset.formats.index.index_rows` (``INDEX_FEATURES``), in manifest order;
    ``shard_file`` is the shard's path relative to the dataset directory (= to the
    uploaded ``hs_shards`` folder). Returns (files, arrow bytes, supervised tokens).
    The bytes are deterministic for the same data and pyarrow version.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hs_dataset.formats.index import INDEX_FEATURES, index_rows

    schema = INDEX_FEATURES.arrow_schema
    out_dir.mkdir(parents=True, exist_ok=True)
    parts: list[Path] = []
    writer = None
    written = 0  # estimated bytes in the current file
    buffered = 0  # estimated bytes not yet written (one row group)
    total_bytes = 0
    supervised_total = 0
    columns: dict[str, list] = {name: [] for name in schema.names}

    def flush() -> None:
        nonlocal total_bytes, buffered
        if not columns["sample_id"]:
            return
        table = pa.Table.from_pydict(columns, schema=schema)
        total_bytes += table.nbytes
        writer.write_table(table)
        for values in columns.values():
            values.clear()
        buffered = 0

    for row in index_rows(dataset):
        row_bytes = 8 * row["seq_len"] + 64 + len(row["sample_id"]) + len(row["shard_file"])
        if writer is None or (written > 0 and written + row_bytes > max_file_bytes):
            if writer is not None:
                flush()
                writer.close()
            path = out_dir / f".part-{len(parts):05d}.parquet"
            writer = pq.ParquetWriter(path, schema)
            parts.append(path)
            written = 0
        supervised_total += row["num_supervised"]
        for name, value in row.items():
            columns[name].append(value)
        written += row_bytes
        buffered += row_bytes
        if len(columns["sample_id"]) >= 4096 or buffered >= 64 * 1024**2:  # bounded row groups
            flush()
    if writer is None:  # an empty dataset still gets one (empty) index file
        path = out_dir / ".part-00000.parquet"
        writer = pq.ParquetWriter(path, schema)
        parts.append(path)
    flush()
    writer.close()
    final = []
    for k, part in enumerate(parts):
        target = out_dir / f"train-{k:05d}-of-{len(parts):05d}.parquet"
        part.rename(target)
        final.append(target)
    return final, total_bytes, supervised_total


# ------------------------------------------------------------------------------- card
def _split_front_matter(text: str) -> tuple[dict[str, Any], str]:
    import yaml

    m = re.match(r"^---\s*\n(.*?)\n?---\s*\n", text, re.S)
    if not m:
        return {}, text
    data = yaml.safe_load(m.group(1)) or {}
    return (data if isinstance(data, dict) else {}), text[m.end():]


def _as_list(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, dict):
        return [value]
    return [v for v in value if isinstance(v, dict)]


def _load_template(name: str):
    import importlib.resources

    import jinja2

    text = importlib.resources.files("hs_dataset.cards").joinpath(name).read_text(encoding="utf-8")
    env = jinja2.Environment(undefined=jinja2.ChainableUndefined, keep_trailing_newline=True, trim_blocks=False, autoescape=False)
    return env.from_string(text)


def _regenerated_files(metadata: dict[str, Any]) -> list[str]:
    """Names of the regenerated-conversations files the manifest lists (``metadata.regeneration.files``)."""
    files = (metadata.get("regeneration") or {}).get("files") or {}
    return sorted(files) if isinstance(files, dict) else []


def _run_summary(root: Path) -> dict[str, Any] | None:
    path = resolve_member(root, "run_report.json", what="run report")
    if not path.exists():
        return None
    try:
        with open_regular(path, what="run report") as f:
            runs = json.loads(f.read(_MAX_RUN_REPORT_BYTES)).get("runs") or []
        runs = [r for r in runs if isinstance(r, dict)]
    except (ValueError, AttributeError, TypeError):
        return None
    if not runs:
        return None
    reasons: dict[str, int] = {}
    for run in runs:
        for issue in (run.get("source") or {}).get("issues", []):
            reasons[issue.get("kind", "issue")] = reasons.get(issue.get("kind", "issue"), 0) + 1
        if run.get("capture_failures"):
            reasons["capture_failed"] = reasons.get("capture_failed", 0) + len(run["capture_failures"])
        if run.get("quarantined"):
            reasons["quarantined_nonfinite"] = reasons.get("quarantined_nonfinite", 0) + len(run["quarantined"])
    first_source = (runs[0].get("source") or {})
    elapsed = sum(float(r.get("elapsed_s") or 0) for r in runs)
    return {
        "runs": len(runs),
        "source": first_source.get("name") or "?",
        "rows_read": max(int((r.get("source") or {}).get("rows_read") or 0) for r in runs),
        "samples_written": sum(int(r.get("samples_written") or 0) for r in runs),
        "tokens_written": sum(int(r.get("tokens_written") or 0) for r in runs),
        "truncated": max(int(r.get("truncated") or 0) for r in runs),
        "not_written": sum(reasons.values()),
        "reasons": ", ".join(f"{k}: {v}" for k, v in sorted(reasons.items())),
        "elapsed": f"{elapsed:.1f} s",
    }


def _layer_meaning(index: int, num_layers: int | None) -> str:
    if index == 0:
        return "the embedding output (input of decoder layer 0)"
    text = f"output of decoder layer {index - 1}"
    if num_layers is None or index < num_layers:
        text += f" (= residual stream entering layer {index})"
    return text


def render_card(
    dataset: Any,
    *,
    repo_id: str,
    config: str,
    supervised_tokens: int,
    index_bytes: int,
    index_download_bytes: int,
    figures: list[str],
    stats: Any = None,
    existing: str | None = None,
) -> str:
    """The README.md for ``repo_id`` with this config's section (other configs' kept from ``existing``)."""
    import yaml

    from hs_dataset.config import CardError, load_card

    manifest = dataset.manifest
    md = manifest.metadata
    root = Path(dataset.root)
    try:
        card = load_card(md.get("config_name") or config)
        description, card_meta = card.description, card.dataset_card.front_matter()
        card_model, card_source = card.model.id or card.model.path, card.source.path
    except (CardError, KeyError, TypeError, ValueError, AttributeError):
        description, card_meta, card_model, card_source = "", {}, None, None
    public = public_metadata(md, card_model)  # no local model/tokenizer directory reaches the card
    tokens = manifest.num_tokens
    context = {
        "config": config,
        "repo_id": repo_id,
        "description": description or f"hs_dataset config `{md.get('config_name')}`.",
        "model": public_model(md, card_model),
        "aux_layer_ids": list(md.get("aux_layer_ids") or []),
        "layer_convention": md.get("layer_convention", "hf_hidden_states_index"),
        "num_hidden_layers": md.get("num_hidden_layers"),
        "layer_rows": [{"index": i, "meaning": _layer_meaning(int(i), md.get("num_hidden_layers"))} for i in md.get("aux_layer_ids") or []],
        "final_state": md.get("final_state", "pre_norm"),
        "final_norm": md.get("final_norm") or {},
        "dtype": md.get("dtype"),
        "encoding": (manifest.tensors.get("aux_hidden_states") or {}).get("encoding"),
        "hidden_size": md.get("hidden_size"),
        "vocab_size": md.get("vocab_size"),
        "tokenizer": public.get("tokenizer") or {},
        "max_length": md.get("max_length"),
        "overflow": md.get("overflow"),
        "backend": public.get("backend") or {},
        "regeneration": md.get("regeneration") or {},
        "config_fingerprint": md.get("config_fingerprint"),
        "dataset_id": manifest.dataset_id,
        "created_by": manifest.created_by,
        "samples": manifest.num_samples,
        "tokens": tokens,
        "supervised_tokens": supervised_tokens,
        "supervised_share": f"{supervised_tokens / tokens:.0%}" if tokens else "n/a",
        "bytes": manifest.num_bytes,
        "bytes_human": _human(manifest.num_bytes),
        "bytes_per_token": f"{manifest.num_bytes / tokens:,.0f}" if tokens else "n/a",
        "quarantined": len(manifest.quarantine),
        "shards": [r.to_json() for r in manifest.shards],
        "max_shard_rows": 64,
        "run": _run_summary(root),
        "figures": [{"alt": Path(f).stem.replace("_", " "), "path": f} for f in figures],
        "layer_stats": [layer.to_json() for layer in stats.layers] if stats is not None else [],
        "stats_complete": bool(stats.complete) if stats is not None else True,
        "stats_samples": stats.samples if stats is not None else 0,
    }
    section = _load_template("dataset_card_config.md.j2").render(**context).strip()

    old_meta, old_body = _split_front_matter(existing or "")
    sections: dict[str, str] = {m.group("name"): m.group(0) for m in _SECTION_RE.finditer(old_body)}
    sections[config] = section

    meta = dict(old_meta)
    for key, value in card_meta.items():  # license, license_name, pretty_name, language, ... from the config card
        if value is not None and key not in meta:
            meta[key] = value
    meta.update(_ecosystem_front_matter(meta, card_meta, md, card_model, [card_source, (_run_summary(root) or {}).get("source")], manifest.num_samples))
    tags = list(meta.get("tags") or [])
    for tag in ("eagle3", "speculative-decoding", "hidden-states", "hs_dataset"):
        if tag not in tags:
            tags.append(tag)
    meta["tags"] = tags
    configs = [c for c in _as_list(meta.get("configs")) if c.get("config_name") != config]
    configs.append({"config_name": config, "data_files": [{"split": "train", "path": f"{config}/train-*.parquet"}]})
    meta["configs"] = sorted(configs, key=lambda c: str(c.get("config_name")))
    infos = [c for c in _as_list(meta.get("dataset_info")) if c.get("config_name") != config]
    infos.append(_dataset_info_yaml(config, manifest.num_samples, index_bytes, index_download_bytes))
    meta["dataset_info"] = sorted(infos, key=lambda c: str(c.get("config_name")))
    front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, width=1000)
    names = sorted(sections)
    title = meta.get("pretty_name") or repo_id
    text = _load_template("dataset_card.md.j2").render(
        front_matter=front, title=title, format_version=manifest.format_version,
        config_names=names, sections=[sections[n] for n in names],
    )
    return re.sub(r"\n{3,}", "\n\n", text).rstrip() + "\n"


def _ecosystem_front_matter(
    meta: dict[str, Any], card_meta: dict[str, Any], md: dict[str, Any], card_model: str | None, sources: list[Any], samples: int
) -> dict[str, Any]:
    """The keys the Hub and its dataset viewer index datasets by: task, size, sources, base model, license name.

    The config card's values win; ``size_categories`` states the largest config in the repo.
    """
    out: dict[str, Any] = {}
    out["task_categories"] = card_meta.get("task_categories") or meta.get("task_categories") or ["text-generation"]
    previous = (meta.get("size_categories") or [None])[0]
    out["size_categories"] = card_meta.get("size_categories") or [bigger_size_category(previous, size_category(samples))]
    out["source_datasets"] = sorted(set(meta.get("source_datasets") or []) | set(source_datasets(*sources)))
    if len(out["source_datasets"]) > 1 and "original" in out["source_datasets"]:
        out["source_datasets"].remove("original")
    base = hub_model_id(model_id(md, card_model))
    if base:
        out["base_model"] = base
    license_id = meta.get("license") or card_meta.get("license")
    if license_id == "other" and not (meta.get("license_name") or card_meta.get("license_name")):
        raise UsageError(
            f"config card {md.get('config_name')!r}: dataset_card.license is 'other' but dataset_card.license_name is "
            "missing; the Hub requires a license_name (and a license_link) with license: other; set them in cards/NAME.yaml"
        )
    return out


def _dataset_info_yaml(config: str, rows: int, num_bytes: int, download_bytes: int) -> dict[str, Any]:
    """The ``dataset_info`` YAML entry datasets.push_to_hub writes (features = INDEX_FEATURES)."""
    import datasets
    from datasets.info import DatasetInfo, DatasetInfosDict
    from huggingface_hub import DatasetCardData

    from hs_dataset.formats.index import INDEX_FEATURES

    info = DatasetInfo(
        features=INDEX_FEATURES,
        config_name=config,
        splits=datasets.SplitDict({"train": datasets.SplitInfo(name="train", num_bytes=num_bytes, num_examples=rows)}),
        download_size=download_bytes,
        dataset_size=num_bytes,
    )
    data = DatasetCardData()
    DatasetInfosDict({config: info}).to_dataset_card_data(data)
    entry = data.to_dict()["dataset_info"]
    return entry[0] if isinstance(entry, list) else entry


# ------------------------------------------------------------------------------- remote
def _remote_files(api: Any, repo_id: str, folder: str, revision: str | None) -> dict[str, _Remote]:
    """{path: remote info} of every file under ``folder`` (one paginated tree listing)."""
    from huggingface_hub.errors import EntryNotFoundError
    from huggingface_hub.hf_api import RepoFile

    out: dict[str, _Remote] = {}
    try:
        for entry in api.list_repo_tree(repo_id, path_in_repo=folder, recursive=True, repo_type=REPO_TYPE, revision=revision):
            if isinstance(entry, RepoFile):
                lfs = entry.lfs
                out[entry.path] = _Remote(int(entry.size), entry.blob_id, lfs.sha256 if lfs is not None else None)
    except EntryNotFoundError:
        pass
    return out


def _remote_readme(api: Any, repo_id: str, revision: str | None, work: Path) -> tuple[str | None, _Remote | None]:
    from huggingface_hub.errors import EntryNotFoundError
    from huggingface_hub.hf_api import RepoFile

    infos = [e for e in api.get_paths_info(repo_id, [README], repo_type=REPO_TYPE, revision=revision) if isinstance(e, RepoFile)]
    if not infos:
        return None, None
    info = infos[0]
    try:
        path = api.hf_hub_download(repo_id, README, repo_type=REPO_TYPE, revision=revision, local_dir=work / "remote")
    except EntryNotFoundError:
        return None, None
    remote = _Remote(int(info.size), info.blob_id, info.lfs.sha256 if info.lfs is not None else None)
    return Path(path).read_text(encoding="utf-8"), remote


def _batches(files: list[_Local], max_bytes: int, max_files: int) -> Iterable[list[_Local]]:
    batch: list[_Local] = []
    size = 0
    for f in files:
        if batch and (size + f.size > max_bytes or len(batch) >= max_files):
            yield batch
            batch, size = [], 0
        batch.append(f)
        size += f.size
    if batch:
        yield batch


# ------------------------------------------------------------------------------- push
def _public_manifest_file(root: Path, work: Path, shards_prefix: str) -> _Local:
    """The manifest the repo gets: a copy without local paths (hub/public.py); the local one is untouched."""
    from hs_dataset.config import CardError, load_card

    with open_regular(resolve_member(root, "manifest.json", what="manifest"), what="manifest") as f:
        raw = json.loads(f.read())
    try:
        card = load_card((raw.get("metadata") or {}).get("config_name") or "")
        card_model = card.model.id or card.model.path
    except (CardError, KeyError, TypeError, ValueError, AttributeError):
        card_model = None
    out = work / "manifest.json"
    out.write_bytes(public_manifest(raw, card_model))
    return _Local(out, f"{shards_prefix}/manifest.json", out.stat().st_size)


def push_to_hub(
    path: str | os.PathLike,
    repo_id: str,
    *,
    api: Any = None,
    token: str | bool | None = None,
    private: bool | None = None,
    config_name: str | None = None,
    revision: str | None = None,
    commit_bytes: int = DEFAULT_COMMIT_BYTES,
    commit_files: int = DEFAULT_COMMIT_FILES,
    plots: bool = True,
    stats_samples: int | None = None,
    index_file_bytes: int = DEFAULT_INDEX_FILE_BYTES,
    work_dir: str | os.PathLike | None = None,
) -> PushReport:
    """Upload the dataset directory ``path`` to the dataset repo ``repo_id`` (see the module doc).

    ``api`` is a ``huggingface_hub.HfApi`` (default ``HfApi(token=token)``; pass one with
    ``endpoint=`` for another Hub). ``config_name`` defaults to the manifest's; it names
    the repo folder and the ``datasets`` config. ``revision`` is a branch (created from
    ``main`` when missing). ``plots=False`` skips the statistics pass and figures;
    ``stats_samples`` limits that pass to the first N samples.
    """
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

    from hs_dataset.errors import IntegrityError
    from hs_dataset.formats.reader import open_dataset

    root = Path(path)
    dataset = open_dataset(root)
    manifest = dataset.manifest
    config = config_name or manifest.metadata.get("config_name")
    if not config or not _CONFIG_RE.match(str(config)):
        raise UsageError(f"config name {config!r} cannot name a repo folder; pass config_name= (letters, digits, '.', '_', '-')")
    if commit_bytes < 1 or commit_files < 1:
        raise UsageError("commit_bytes and commit_files must be >= 1")
    api = api if api is not None else HfApi(token=token)
    branch = revision or "main"
    report = PushReport(repo_id=repo_id, config=config, revision=branch)

    # ---- what we publish: the dataset directory's files, checked locally first (sizes)
    shards_prefix = f"{config}/{SHARDS_FOLDER}"
    data_files: list[_Local] = []
    for index, record in enumerate(manifest.shards):
        local = resolve_member(root, record.file, what=f"shards[{index}].file")
        if not local.is_file():
            raise IntegrityError(f"{local}: shard listed in the manifest is missing")
        size = local.stat().st_size
        if size != record.bytes:
            raise IntegrityError(f"{local}: {size} bytes on disk but the manifest says {record.bytes}")
        data_files.append(_Local(local, f"{shards_prefix}/{record.file}", size, record.sha256, record.blake3))
    norm = manifest.metadata.get("final_norm") or {}
    if norm.get("weight_file"):
        local = resolve_member(root, norm["weight_file"], what="metadata.final_norm.weight_file")
        if not local.is_file():
            raise IntegrityError(f"{local}: the final-norm weight named by the manifest is missing")
        # checked here (no link, a valid [H] weight, its recorded hash); the upload must hash the same
        from hs_dataset.formats.reader import load_norm_weight

        load_norm_weight(root, norm, where=str(root / "manifest.json"), hidden_size=manifest.hidden_size)
        data_files.append(_Local(local, f"{shards_prefix}/{norm['weight_file']}", local.stat().st_size, norm.get("weight_sha256")))

    api.create_repo(repo_id, repo_type=REPO_TYPE, private=private, exist_ok=True)
    if branch != "main":
        api.create_branch(repo_id, branch=branch, repo_type=REPO_TYPE, exist_ok=True)
    remote = _remote_files(api, repo_id, config, revision)

    # ---- 1. shards and norm weight: bounded commits, hashes checked before committing
    pending = []
    for f in data_files:
        if _same(f, remote.get(f.repo_path)):
            report.skipped.append(f.repo_path)
        else:
            pending.append(f)
    batches = list(_batches(pending, commit_bytes, commit_files))
    for number, batch in enumerate(batches, 1):
        ops = [CommitOperationAdd(path_in_repo=f.repo_path, path_or_fileobj=str(f.local)) for f in batch]
        api.preupload_lfs_files(repo_id, additions=ops, repo_type=REPO_TYPE, revision=revision)
        for f, op in zip(batch, ops):
            uploaded = op.upload_info.sha256.hex()
            if uploaded != f.digest():
                raise IntegrityError(
                    f"{f.local}: sha256 {uploaded} of the uploaded bytes != {f.digest()} of the bytes checked against the manifest; "
                    "not published (corrupted shard)"
                )
        crash_point("push.before_commit")
        info = api.create_commit(
            repo_id, operations=ops, repo_type=REPO_TYPE, revision=revision,
            commit_message=f"hs_dataset: {config} shards ({number}/{len(batches)})",
        )
        report.commits.append(info.oid)
        report.uploaded.extend(f.repo_path for f in batch)
        report.bytes_uploaded += sum(f.size for f in batch)
        logger.info("committed %d file(s) of %s (%d/%d)", len(batch), config, number, len(batches))
    for record, f in zip(manifest.shards, data_files):
        record.sha256 = f.digest()  # in memory only: the card lists every shard's LFS oid, format 1 or 2

    # ---- 2. manifest, run report, index, figures, card: one last commit
    temp = None
    if work_dir is None:
        temp = tempfile.TemporaryDirectory(prefix="hs_dataset-push-")
        work = Path(temp.name)
    else:
        work = Path(work_dir)
        work.mkdir(parents=True, exist_ok=True)
    try:
        meta_files: list[_Local] = []
        for name in ("run_report.json", *_regenerated_files(dataset.manifest.metadata)):
            local = resolve_member(root, name, what="dataset file")
            if local.is_file():
                meta_files.append(_Local(local, f"{shards_prefix}/{name}", local.stat().st_size))
        meta_files.append(_public_manifest_file(root, work, shards_prefix))
        index_dir = work / "index"
        if index_dir.exists():
            shutil.rmtree(index_dir)
        index_paths, index_bytes, supervised = write_index(dataset, index_dir, max_file_bytes=index_file_bytes)
        index_download = 0
        for p in index_paths:
            meta_files.append(_Local(p, f"{config}/{p.name}", p.stat().st_size))
            index_download += p.stat().st_size
        figure_paths: list[str] = []
        stats = None
        if plots:
            try:
                from hs_dataset.formats.stats import PlotsUnavailable, compute_stats, write_plots

                stats = compute_stats(root, max_samples=stats_samples)
                fig_dir = work / "figures"
                for p in write_plots(root, fig_dir, stats=stats):
                    repo_path = f"{config}/{FIGURES_FOLDER}/{p.name}"
                    meta_files.append(_Local(p, repo_path, p.stat().st_size))
                    figure_paths.append(repo_path)
            except PlotsUnavailable as exc:
                logger.warning("no figures in the card: %s", exc)
        existing, readme_remote = _remote_readme(api, repo_id, revision, work)
        card_text = render_card(
            dataset, repo_id=repo_id, config=config, supervised_tokens=supervised, index_bytes=index_bytes,
            index_download_bytes=index_download, figures=figure_paths, stats=stats, existing=existing,
        )
        card_path = work / README
        card_path.write_text(card_text, encoding="utf-8")
        readme = _Local(card_path, README, card_path.stat().st_size)

        ops: list[Any] = []
        for f in meta_files:
            if _same(f, remote.get(f.repo_path)):
                report.skipped.append(f.repo_path)
            else:
                ops.append(CommitOperationAdd(path_in_repo=f.repo_path, path_or_fileobj=str(f.local)))
                report.bytes_uploaded += f.size
        if existing == card_text and readme_remote is not None:
            report.skipped.append(README)
        else:
            ops.append(CommitOperationAdd(path_in_repo=README, path_or_fileobj=str(readme.local)))
            report.bytes_uploaded += readme.size
        keep = {f.repo_path for f in data_files} | {f.repo_path for f in meta_files}
        stale = sorted(p for p in remote if p not in keep)
        ops.extend(CommitOperationDelete(path_in_repo=p) for p in stale)
        if ops:
            info = api.create_commit(
                repo_id, operations=ops, repo_type=REPO_TYPE, revision=revision,
                commit_message=f"hs_dataset: {config} manifest, index and card",
            )
            report.commits.append(info.oid)
            report.uploaded.extend(op.path_in_repo for op in ops if isinstance(op, CommitOperationAdd))
            report.deleted.extend(stale)
    finally:
        if temp is not None:
            temp.cleanup()
    logger.info(report.summary())
    return report


# ------------------------------------------------------------------------------- load back
def _configs_of(readme_text: str) -> list[str]:
    meta, _ = _split_front_matter(readme_text)
    return [str(c.get("config_name")) for c in _as_list(meta.get("configs")) if c.get("config_name")]


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
        root = Path(api.snapshot_download(
            repo_id, repo_type=REPO_TYPE, revision=revision, local_dir=local_dir,
            allow_patterns=[README, f"{config}/*"],
        ))
    if config is None:
        config = _only_config((root / README).read_text(encoding="utf-8"), str(root))
    shards_dir = root / config / SHARDS_FOLDER
    data = open_dataset(shards_dir, verify_hashes=True)
    for i in range(len(data.manifest.shards)):
        data.shard(i)  # size, header, structure and hash against the manifest
    if (data.manifest.metadata.get("final_norm") or {}).get("weight_file"):
        data.final_norm()  # sha256 of the weight file against the manifest
    return root, config


def _only_config(readme_text: str, where: str) -> str:
    names = _configs_of(readme_text)
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
    from hs_dataset.errors import IntegrityError
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

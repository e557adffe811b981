"""Publish a dataset directory to the Hugging Face Hub: ``push_to_hub(path, repo_id)``.

The dataset goes into a dataset repository, one folder per config (the layout is in
:mod:`hs_dataset.hub.layout`). The push is resumable and bounded:

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
  uploaded by the interrupted run are not sent twice (the Hub deduplicates by oid);
* a push that replaces a file the repo holds under the same name (another build of the
  config, pushed over an earlier one) first deletes the repo's manifest in a commit of its
  own: from then until the last commit a reader sees no dataset, never a manifest whose
  shards have other bytes than it records (a kill in between leaves it so until the push
  is run again).

The README carries the metadata of the config card that built the dataset
(:mod:`hs_dataset.hub.config_card`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from hs_dataset.config import Card
from hs_dataset.errors import IntegrityError, UsageError
from hs_dataset.faults import crash_point
from hs_dataset.formats.build_state import refuse_unfinished
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest
from hs_dataset.formats.metadata import DatasetMetadata
from hs_dataset.formats.paths import open_regular, resolve_member
from hs_dataset.hub.config_card import CardChoice, card_for_push, card_model_name
from hs_dataset.hub.files import LocalFile, RemoteFile, batches, same_bytes
from hs_dataset.hub.index import DEFAULT_INDEX_FILE_BYTES, IndexFiles, write_index
from hs_dataset.hub.layout import FIGURES_FOLDER, README, REPO_TYPE, SHARDS_FOLDER
from hs_dataset.hub.public import public_manifest, public_run_report
from hs_dataset.hub.readme import render_card
from hs_dataset.hub.repo_id import check_repo_id
from hs_dataset.hub.repo_state import remote_files, remote_readme
from hs_dataset.pipeline.run_report import RUN_REPORT_NAME
from hs_dataset.progress.task import task

__all__ = ["DEFAULT_COMMIT_BYTES", "DEFAULT_COMMIT_FILES", "PushOptions", "PushReport", "push_to_hub"]

logger = logging.getLogger(__name__)

DEFAULT_COMMIT_BYTES = 16 * 1024**3  # per shard commit
DEFAULT_COMMIT_FILES = 50  # per shard commit (the Hub prefers commits of tens of files)
_RUN_REPORT = RUN_REPORT_NAME
_MAX_RUN_REPORT_BYTES = 64 * 1024 * 1024  # a run report lists every dropped row: large, never unbounded
_CONFIG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


# ------------------------------------------------------------------------------- settings and report
@dataclass(frozen=True, kw_only=True)
class PushOptions:
    """Where a push goes and how it uploads; ``push_to_hub(..., **settings)`` takes the same names.

    ``config_name`` (default: the manifest's) names the repo folder and the ``datasets``
    config; ``revision`` is a branch (created from ``main`` when missing); ``private``
    applies when the repo is created. Shards go up in commits of at most
    ``commit_bytes`` / ``commit_files``; index files hold about ``index_file_bytes``.
    ``plots=False`` skips the statistics pass and figures; ``stats_samples`` limits that
    pass to the first N samples. ``work_dir`` keeps the generated files (default: a
    temporary directory, removed afterwards).
    """

    config_name: str | None = None
    revision: str | None = None
    private: bool | None = None
    commit_bytes: int = DEFAULT_COMMIT_BYTES
    commit_files: int = DEFAULT_COMMIT_FILES
    plots: bool = True
    stats_samples: int | None = None
    index_file_bytes: int = DEFAULT_INDEX_FILE_BYTES
    work_dir: str | os.PathLike | None = None

    def __post_init__(self) -> None:
        for name in ("commit_bytes", "commit_files", "index_file_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise UsageError(f"{name} must be a whole number of {name.split('_')[-1]}, got {value!r}")
        if self.stats_samples is not None and (isinstance(self.stats_samples, bool) or not isinstance(self.stats_samples, int)):
            raise UsageError(f"stats_samples must be a number of samples or None, got {self.stats_samples!r}")
        if self.commit_bytes < 1 or self.commit_files < 1:
            raise UsageError("commit_bytes and commit_files must be >= 1")

    @classmethod
    def of(cls, options: PushOptions | None, settings: dict[str, Any]) -> PushOptions:
        """``options`` (default: the defaults) with keyword ``settings`` on top; an unknown name is refused."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise TypeError(f"push_to_hub() got unexpected keyword argument(s) {unknown}; the upload settings are {sorted(known)}")
        return replace(options, **settings) if options is not None else cls(**settings)


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


@dataclass(frozen=True)
class _Target:
    """The repo, branch and config folder a push writes to, and the client that writes."""

    api: Any
    repo_id: str
    config: str
    revision: str | None

    @property
    def shards_prefix(self) -> str:
        return f"{self.config}/{SHARDS_FOLDER}"

    def commit(self, operations: list[Any], message: str) -> str:
        info = self.api.create_commit(
            self.repo_id,
            operations=operations,
            repo_type=REPO_TYPE,
            revision=self.revision,
            commit_message=message,
        )
        return info.oid


# ------------------------------------------------------------------------------- the push
def push_to_hub(
    path: str | os.PathLike,
    repo_id: str,
    *,
    card: CardChoice = None,
    api: Any = None,
    token: str | bool | None = None,
    options: PushOptions | None = None,
    allow_incomplete: bool = False,
    **settings: Any,
) -> PushReport:
    """Upload the dataset directory ``path`` to the dataset repo ``repo_id`` (see the module doc).

    ``card`` is the config card that built the dataset (a :class:`~hs_dataset.config.Card`,
    a shipped name or a card file's path; default: the shipped card the manifest names;
    ``False``: none), whose ``dataset_card:`` keys the README carries. ``api`` is a
    ``huggingface_hub.HfApi`` (default ``HfApi(token=token)``; pass one with ``endpoint=``
    for another Hub). The upload settings are :class:`PushOptions`, given as ``options=``
    or as keywords (``config_name=``, ``revision=``, ``commit_files=``, ``plots=``, ...).

    A dataset whose build has not finished (``manifest.json`` ``build.state`` ``running``: killed or stopped) is
    refused with :class:`~hs_dataset.errors.IncompleteDatasetError` before any request, unless ``allow_incomplete``:
    half a dataset must not reach the Hub by accident.
    """
    from huggingface_hub import HfApi

    from hs_dataset.formats.reader import open_dataset

    check_repo_id(repo_id)  # before the dataset is read: huggingface_hub would only refuse it at the first request
    opts = PushOptions.of(options, settings)
    root = Path(path)
    dataset = open_dataset(root)
    if not allow_incomplete:
        refuse_unfinished(path, dataset.manifest, "push")
    config = _config_folder(opts.config_name, dataset.manifest)
    target = _Target(api if api is not None else HfApi(token=token), repo_id, config, opts.revision)
    data_files = _data_files(root, dataset.manifest, target.shards_prefix)
    chosen = card_for_push(card, dataset.manifest.metadata, config=config, where=str(root))
    report = PushReport(repo_id=repo_id, config=config, revision=opts.revision or "main")
    _prepare_repo(target, opts.private)
    remote = remote_files(target.api, repo_id, config, opts.revision)
    _commit_data_files(target, data_files, remote, opts, report)
    for record, f in zip(dataset.manifest.shards, data_files):
        record.sha256 = f.digest()  # in memory only: the card lists every shard's LFS oid, format 1 or 2
    with _work_dir(opts.work_dir) as work:
        files, readme = _last_commit_files(target, dataset, chosen, opts, work)
        _commit_last(target, files, readme, data_files, remote, report)
    logger.info(report.summary())
    return report


def _config_folder(config_name: str | None, manifest: Any) -> str:
    """The repo folder (and ``datasets`` config) name: the caller's, else the manifest's."""
    config = config_name or manifest.metadata.config_name
    if not config or not _CONFIG_RE.match(str(config)):
        raise UsageError(f"config name {config!r} cannot name a repo folder; pass config_name= (letters, digits, '.', '_', '-')")
    return config


def _data_files(root: Path, manifest: Any, shards_prefix: str) -> list[LocalFile]:
    """The shards and the norm weight, checked locally first (present, sizes, the weight's hash)."""
    data_files: list[LocalFile] = []
    for index, record in enumerate(manifest.shards):
        local = resolve_member(root, record.file, what=f"shards[{index}].file")
        if not local.is_file():
            raise IntegrityError(f"{local}: shard listed in the manifest is missing")
        size = local.stat().st_size
        if size != record.bytes:
            raise IntegrityError(f"{local}: {size} bytes on disk but the manifest says {record.bytes}")
        data_files.append(LocalFile(local, f"{shards_prefix}/{record.file}", size, record.sha256, record.blake3))
    norm = manifest.metadata.final_norm
    if norm is not None and norm.weight_file:
        local = resolve_member(root, norm.weight_file, what="metadata.final_norm.weight_file")
        if not local.is_file():
            raise IntegrityError(f"{local}: the final-norm weight named by the manifest is missing")
        # checked here (no link, a valid [H] weight, its recorded hash); the upload must hash the same
        from hs_dataset.formats.reader import load_norm_weight

        load_norm_weight(root, norm, where=str(root / "manifest.json"), hidden_size=manifest.hidden_size)
        data_files.append(LocalFile(local, f"{shards_prefix}/{norm.weight_file}", local.stat().st_size, norm.weight_sha256))
    return data_files


def _prepare_repo(target: _Target, private: bool | None) -> None:
    """Create the repo (and the branch) when missing."""
    target.api.create_repo(target.repo_id, repo_type=REPO_TYPE, private=private, exist_ok=True)
    if (target.revision or "main") != "main":
        target.api.create_branch(target.repo_id, branch=target.revision, repo_type=REPO_TYPE, exist_ok=True)


# ------------------------------------------------------------------------------- 1. shards and norm weight
def _commit_data_files(
    target: _Target, data_files: list[LocalFile], remote: dict[str, RemoteFile], opts: PushOptions, report: PushReport
) -> None:
    """Bounded commits of the files the repo lacks, each batch's hashes checked before it is committed."""
    pending = []
    for f in data_files:
        if same_bytes(f, remote.get(f.repo_path)):
            report.skipped.append(f.repo_path)
        else:
            pending.append(f)
    _withdraw_manifest(target, pending, remote, report)
    todo = list(batches(pending, opts.commit_bytes, opts.commit_files))
    shown = task("push", "commits", len(todo), verb="uploaded")
    for number, batch in enumerate(shown.track(todo, nbytes=lambda b: sum(f.size for f in b)), 1):
        ops = _uploaded_batch(target, batch)
        crash_point("push.before_commit")
        report.commits.append(target.commit(ops, f"hs_dataset: {target.config} shards ({number}/{len(todo)})"))
        report.uploaded.extend(f.repo_path for f in batch)
        report.bytes_uploaded += sum(f.size for f in batch)
        logger.info("committed %d file(s) of %s (%d/%d)", len(batch), target.config, number, len(todo))


def _withdraw_manifest(target: _Target, pending: list[LocalFile], remote: dict[str, RemoteFile], report: PushReport) -> None:
    """Delete the repo's manifest before a file it may list is replaced under its name; the last commit adds the new one."""
    from huggingface_hub import CommitOperationDelete

    manifest = f"{target.shards_prefix}/{MANIFEST_NAME}"
    if manifest not in remote or not any(f.repo_path in remote for f in pending):
        return
    report.commits.append(
        target.commit([CommitOperationDelete(path_in_repo=manifest)], f"hs_dataset: {target.config} withdrawn while replaced")
    )
    del remote[manifest]  # the last commit adds it again
    logger.info("withdrew %s: this push replaces files it lists", manifest)


def _uploaded_batch(target: _Target, batch: list[LocalFile]) -> list[Any]:
    """Upload ``batch`` (not yet committed) and check that the bytes sent are the bytes checked against the manifest."""
    from huggingface_hub import CommitOperationAdd

    ops = [CommitOperationAdd(path_in_repo=f.repo_path, path_or_fileobj=str(f.local)) for f in batch]
    target.api.preupload_lfs_files(target.repo_id, additions=ops, repo_type=REPO_TYPE, revision=target.revision)
    for f, op in zip(batch, ops):
        uploaded = op.upload_info.sha256.hex()
        if uploaded != f.digest():
            raise IntegrityError(
                f"{f.local}: sha256 {uploaded} of the uploaded bytes != {f.digest()} of the bytes checked against the manifest; "
                "not published (corrupted shard)"
            )
    return ops


# ------------------------------------------------------------------------------- 2. run report, manifest, index, figures, card
@contextmanager
def _work_dir(work_dir: str | os.PathLike | None) -> Iterator[Path]:
    """Where the generated files are written: ``work_dir``, else a temporary directory removed afterwards."""
    if work_dir is not None:
        work = Path(work_dir)
        work.mkdir(parents=True, exist_ok=True)
        yield work
        return
    with tempfile.TemporaryDirectory(prefix="hs_dataset-push-") as temp:
        yield Path(temp)


def _last_commit_files(
    target: _Target, dataset: Any, card: Card | None, opts: PushOptions, work: Path
) -> tuple[list[LocalFile], LocalFile | None]:
    """The files of the last commit: run report, manifest, index and figures, then the README.

    The README is None when the repo's already has exactly this text.
    """
    root = Path(dataset.root)
    files = _dataset_metadata_files(root, dataset.manifest.metadata, target.shards_prefix, work)
    files.append(_public_manifest_file(root, work, target.shards_prefix, card_model_name(card)))
    index = _index_files(dataset, work, opts.index_file_bytes)
    files.extend(LocalFile(p, f"{target.config}/{p.name}", p.stat().st_size) for p in index.files)
    figures, stats = _figures(root, work, target.config, opts)
    files.extend(figures)
    existing, readme_remote = remote_readme(target.api, target.repo_id, target.revision, work)
    text = render_card(
        dataset,
        card,
        repo_id=target.repo_id,
        config=target.config,
        index=index,
        figures=[f.repo_path for f in figures],
        stats=stats,
        existing=existing,
    )
    readme = _readme_file(work, text)
    return files, (None if existing == text and readme_remote is not None else readme)


def _commit_last(
    target: _Target,
    files: list[LocalFile],
    readme: LocalFile | None,
    data_files: list[LocalFile],
    remote: dict[str, RemoteFile],
    report: PushReport,
) -> None:
    """One commit of what changed, deleting the files under the config's folder that this dataset does not have."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    ops: list[Any] = []
    for f in files:
        if same_bytes(f, remote.get(f.repo_path)):
            report.skipped.append(f.repo_path)
        else:
            ops.append(CommitOperationAdd(path_in_repo=f.repo_path, path_or_fileobj=str(f.local)))
            report.bytes_uploaded += f.size
    if readme is None:
        report.skipped.append(README)
    else:
        ops.append(CommitOperationAdd(path_in_repo=README, path_or_fileobj=str(readme.local)))
        report.bytes_uploaded += readme.size
    keep = {f.repo_path for f in data_files} | {f.repo_path for f in files}
    stale = sorted(p for p in remote if p not in keep)
    ops.extend(CommitOperationDelete(path_in_repo=p) for p in stale)
    if ops:
        crash_point("push.before_last_commit")
        report.commits.append(target.commit(ops, f"hs_dataset: {target.config} manifest, index and card"))
        report.uploaded.extend(op.path_in_repo for op in ops if isinstance(op, CommitOperationAdd))
        report.deleted.extend(stale)


def _regenerated_files(metadata: DatasetMetadata) -> list[str]:
    """Names of the regenerated-conversations files the manifest lists (``metadata.regeneration.files``)."""
    return sorted((metadata.regeneration and metadata.regeneration.files) or {})


def _dataset_metadata_files(root: Path, metadata: DatasetMetadata, shards_prefix: str, work: Path) -> list[LocalFile]:
    """The run report (a copy without local paths) and the regenerated conversations, where the directory has them."""
    found = []
    for name in (_RUN_REPORT, *_regenerated_files(metadata)):
        local = resolve_member(root, name, what="dataset file")
        if local.is_file():
            if name == _RUN_REPORT:
                local = _public_run_report_file(root, local, work, metadata)
            found.append(LocalFile(local, f"{shards_prefix}/{name}", local.stat().st_size))
    return found


def _public_run_report_file(root: Path, local: Path, work: Path, metadata: DatasetMetadata) -> Path:
    """``run_report.json`` as pushed: ``out_dir`` dropped, the root, model and tokenizer paths replaced (hub/public.py)."""
    with open_regular(local, what="run report") as f:
        text = f.read(_MAX_RUN_REPORT_BYTES + 1)
    try:
        raw = json.loads(text)
    except ValueError:
        raise IntegrityError(f"{local}: not valid JSON; fix or delete the run report before pushing") from None
    paths = [str(root), str(root.resolve())]
    paths += [str(record.path or "") for record in (metadata.model, metadata.tokenizer) if record is not None]
    out = work / _RUN_REPORT
    out.write_bytes(public_run_report(raw, paths))
    return out


def _public_manifest_file(root: Path, work: Path, shards_prefix: str, card_model: str | None) -> LocalFile:
    """The manifest the repo gets: a copy without local paths (hub/public.py); the local one is untouched."""
    out = work / "manifest.json"
    out.write_bytes(public_manifest(Manifest.load(root), card_model))
    return LocalFile(out, f"{shards_prefix}/manifest.json", out.stat().st_size)


def _index_files(dataset: Any, work: Path, max_file_bytes: int) -> IndexFiles:
    """The index parquet, written afresh under ``work/index``."""
    index_dir = work / "index"
    if index_dir.exists():
        shutil.rmtree(index_dir)
    return write_index(dataset, index_dir, max_file_bytes=max_file_bytes)


def _figures(root: Path, work: Path, config: str, opts: PushOptions) -> tuple[list[LocalFile], Any]:
    """The figures (and the statistics drawn in them), unless ``plots=False`` or matplotlib is missing."""
    if not opts.plots:
        return [], None
    from hs_dataset.formats.stats import PlotsUnavailable, compute_stats, write_plots

    figures: list[LocalFile] = []
    stats = None
    try:
        stats = compute_stats(root, max_samples=opts.stats_samples)
        for p in write_plots(root, work / "figures", stats=stats, replace=True):  # the push's own work directory
            figures.append(LocalFile(p, f"{config}/{FIGURES_FOLDER}/{p.name}", p.stat().st_size))
    except PlotsUnavailable as exc:
        logger.warning("no figures in the card: %s", exc)
    return figures, stats


def _readme_file(work: Path, text: str) -> LocalFile:
    path = work / README
    path.write_text(text, encoding="utf-8")
    return LocalFile(path, README, path.stat().st_size)

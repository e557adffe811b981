"""A dataset directory written locally, uploaded to a URL: shards first, the manifest last.

A prefix is written only once it is this dataset's: it holds this dataset's manifest,
or it held nothing and the first upload claimed it by writing ``hs_dataset-upload.json``
(the dataset id) before any shard. A prefix holding anything else, another dataset or
another tool's objects, is refused before anything is written (:func:`refuse_foreign`),
as a local output directory is; one holding the claim of an upload that never wrote a
manifest holds only that upload's leftovers, and is taken over.

The remote manifest is a byte-for-byte copy of a local one, uploaded only after every
shard it lists is stored and checked (:mod:`.transfer`), so a reader of the URL never
sees a listed shard that is missing or partial. What the remote manifest already lists
is not sent again; anything else the local one lists is (re)uploaded whole, so a rank
killed mid-upload resumes by running the same upload: objects it left unlisted are
overwritten, none is listed twice, and no sample is lost or duplicated (the shards'
samples are what the local writer stored, once each).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from hs_dataset import strict_json
from hs_dataset.errors import ForeignDatasetError, HsDatasetError, IntegrityError
from hs_dataset.faults import crash_point
from hs_dataset.formats.atomic import is_temp_name
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest, read_manifest_bytes
from hs_dataset.formats.paths import check_plain_name, resolve_member
from hs_dataset.remote.location import RemoteLocation, storage_errors
from hs_dataset.remote.transfer import Expected, put_bytes, upload_file

__all__ = [
    "CLAIM_NAME",
    "PublishReport",
    "claimed_by",
    "foreign_objects",
    "publish_dataset",
    "refuse_foreign",
    "remove_claim",
    "write_claim",
]

_log = logging.getLogger("hs_dataset.remote")
_RUN_REPORT = "run_report.json"
CLAIM_NAME = "hs_dataset-upload.json"  # written first into an empty prefix: the dataset id whose upload owns it
_CLAIM_FORMAT = "hs_dataset-upload"


@dataclass
class PublishReport:
    """What one upload did."""

    uploaded: list[str] = field(default_factory=list)
    already_there: int = 0
    bytes: int = 0
    manifest_written: bool = False


def publish_dataset(local: str | Path, loc: RemoteLocation) -> PublishReport:
    """Upload what ``local``'s manifest lists and ``loc``'s does not, then ``local``'s manifest itself."""
    local = Path(local)
    data = read_manifest_bytes(local)  # one snapshot: the writer may publish more meanwhile
    manifest = Manifest.from_json(strict_json.loads(data.decode("utf-8")), str(local / MANIFEST_NAME))
    remote = loc.manifest()
    if remote is None:
        _claim(loc, manifest.dataset_id)
    report = PublishReport()
    if remote is not None and remote.encode() == manifest.encode():
        report.already_there = len(manifest.shards)
        return report
    listed = _remote_shards(local, manifest, remote, loc)
    for index, record in enumerate(manifest.shards):
        if listed.get(record.file) == record.digest:
            report.already_there += 1
            continue
        path = resolve_member(local, record.file, what=f"shards[{index}].file")
        upload_file(path, loc, record.file, Expected(record.bytes, record.hash_algorithm, record.digest))
        report.uploaded.append(record.file)
        report.bytes += record.bytes
    _upload_side_files(local, manifest, remote, loc)
    crash_point("remote.before_manifest")
    put_bytes(loc, MANIFEST_NAME, data)
    report.manifest_written = True
    if report.uploaded:
        _log.info("uploaded %d shard(s), %.1f MiB, and the manifest to %s", len(report.uploaded), report.bytes / 2**20, loc.url)
    return report


def foreign_objects(loc: RemoteLocation) -> list[str]:
    """What lies under ``loc`` besides temp objects (of an interrupted upload): names, sorted; [] where nothing is."""
    with storage_errors(loc.url):
        loc.fs.invalidate_cache(loc.root)
        try:
            names = loc.call("ls", loc.root, detail=False)
        except FileNotFoundError:
            return []
    found = {os.path.basename(str(name).rstrip("/")) for name in names}
    return sorted(name for name in found if name and not is_temp_name(name))


def refuse_foreign(loc: RemoteLocation, dataset_id: str | None) -> None:
    """The destination rule where ``loc`` holds no manifest: nothing there (a local --out directory's rule too), or an upload's claim.

    The claim must be ``dataset_id``'s, or, where the caller has no dataset yet (None),
    any upload's that never wrote a manifest (a rank requeued without its staging directory).
    """
    foreign = foreign_objects(loc)
    if not foreign:
        return
    claimed = claimed_by(loc) if CLAIM_NAME in foreign else None
    if claimed is not None and dataset_id in (None, claimed):
        return
    if claimed is not None:
        raise ForeignDatasetError(
            f"{loc.url}: another build (dataset id {claimed}) is uploading there, this one is {dataset_id}; nothing was changed: "
            "give each build its own prefix"
        )
    raise ForeignDatasetError(
        f"{loc.url} is not empty and holds no hs_dataset manifest ({len(foreign)} entries, e.g. {foreign[:3]}); "
        "nothing in it was changed: choose an empty or new prefix"
    )


def claimed_by(loc: RemoteLocation) -> str | None:
    """The dataset id (or merge) the prefix's claim names; None when there is none, or not one hs_dataset wrote."""
    try:
        raw = strict_json.loads(bytes(loc.read_bytes(CLAIM_NAME, 4096) or b"").decode("utf-8"))
        if isinstance(raw, dict) and raw.get("format") == _CLAIM_FORMAT:
            return check_plain_name(raw.get("dataset_id"), what="dataset_id", where=f"{loc.url}/{CLAIM_NAME}")
    except (ValueError, RecursionError, HsDatasetError):  # a claim nested past the parser's depth is no claim of ours either
        pass
    return None


def _claim(loc: RemoteLocation, dataset_id: str) -> None:
    """A prefix becomes this dataset's before any shard is written there: its claim names the dataset id."""
    refuse_foreign(loc, dataset_id)
    write_claim(loc, dataset_id)


def write_claim(loc: RemoteLocation, owner: str) -> None:
    """The claim object naming ``owner`` (a dataset id, or a remote merge's name): what a rerun after a kill finds its leftovers by."""
    put_bytes(loc, CLAIM_NAME, json.dumps({"format": _CLAIM_FORMAT, "dataset_id": owner}).encode())


def remove_claim(loc: RemoteLocation) -> None:
    """Delete the claim once a manifest owns the prefix (a remote merge's; best effort: a claim beside a manifest is never read)."""
    try:
        with storage_errors(loc.url):
            loc.call("rm", loc.key(CLAIM_NAME))
    except (FileNotFoundError, HsDatasetError):
        pass


def _remote_shards(local: Path, manifest: Manifest, remote: Manifest | None, loc: RemoteLocation) -> dict[str, str]:
    """The shards the remote manifest lists (name -> digest), after checking it is this dataset and no newer than ``local``."""
    if remote is None:
        return {}
    if remote.dataset_id != manifest.dataset_id:
        raise ForeignDatasetError(
            f"{loc.url} already holds another dataset (dataset id {remote.dataset_id}, the local {local} is {manifest.dataset_id}); "
            "upload to a new prefix, or delete the old one"
        )
    mine = {record.file for record in manifest.shards}
    extra = [record.file for record in remote.shards if record.file not in mine]
    if extra:
        raise IntegrityError(
            f"{loc.url}: lists shards the local copy {local} lacks ({extra[:2]}); another process wrote there, or the local copy "
            "is older: delete the local copy to resume from the bucket"
        )
    return {record.file: record.digest for record in remote.shards}


def _upload_side_files(local: Path, manifest: Manifest, remote: Manifest | None, loc: RemoteLocation) -> None:
    """The final-norm weight (once, sha256 checked), the regenerated conversations (sha256 checked) and the run report."""
    norm = manifest.metadata.final_norm
    if norm is not None and norm.weight_file is not None and (remote is None or loc.size(norm.weight_file) is None):
        path = resolve_member(local, norm.weight_file, what="metadata.final_norm.weight_file")
        upload_file(path, loc, norm.weight_file, Expected(path.stat().st_size, "sha256", norm.weight_sha256))
    regeneration = manifest.metadata.regeneration
    for name, info in ((regeneration and regeneration.files) or {}).items():
        path = resolve_member(local, name, what=f"metadata.regeneration.files[{name!r}]")
        upload_file(path, loc, name, Expected(path.stat().st_size, "sha256", info.sha256))
    report = local / _RUN_REPORT
    if report.is_file():
        upload_file(report, loc, _RUN_REPORT, Expected(report.stat().st_size))

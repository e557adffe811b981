"""A dataset directory written locally, uploaded to a URL: shards first, the manifest last.

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
from dataclasses import dataclass, field
from pathlib import Path

from hs_dataset.errors import ForeignDatasetError, IntegrityError
from hs_dataset.faults import crash_point
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest, read_manifest_bytes
from hs_dataset.formats.paths import resolve_member
from hs_dataset.remote.location import RemoteLocation
from hs_dataset.remote.transfer import Expected, put_bytes, upload_file

__all__ = ["PublishReport", "publish_dataset"]

_log = logging.getLogger("hs_dataset.remote")
_RUN_REPORT = "run_report.json"


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
    manifest = Manifest.from_json(json.loads(data.decode("utf-8")), str(local / MANIFEST_NAME))
    remote = loc.manifest()
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
    norm = manifest.metadata.get("final_norm") or {}
    if "weight_file" in norm and (remote is None or loc.size(str(norm["weight_file"])) is None):
        path = resolve_member(local, norm["weight_file"], what="metadata.final_norm.weight_file")
        upload_file(path, loc, str(norm["weight_file"]), Expected(path.stat().st_size, "sha256", norm.get("weight_sha256")))
    regeneration = manifest.metadata.get("regeneration")
    files = regeneration.get("files") if isinstance(regeneration, dict) else None
    for name, info in (files or {}).items():
        path = resolve_member(local, name, what=f"metadata.regeneration.files[{name!r}]")
        sha = info.get("sha256") if isinstance(info, dict) else None
        upload_file(path, loc, name, Expected(path.stat().st_size, "sha256", sha))
    report = local / _RUN_REPORT
    if report.is_file():
        upload_file(report, loc, _RUN_REPORT, Expected(report.stat().st_size))

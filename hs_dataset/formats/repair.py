"""Take a dataset's damaged shards out so its build captures their samples again, then check every one came back.

Why the build does the capturing: a resumed build already skips the sample ids the
manifest lists and, with the in-process backend, re-captures whole fixed windows of the
source order, so un-listing a shard makes the same command store exactly its samples
again, bit for bit. This module owns only the dataset side, in three steps that each
leave a dataset a re-run of ``hs-dataset repair`` finishes (kill -9 anywhere):

1. :func:`find_damaged`: every listed shard that is missing, of the wrong size, fails its
   hash or does not parse (the reader's own checks, hashes included);
2. :func:`take_out`: each damaged file is moved aside (``NAME.damaged``) *before* the one
   atomic manifest write that un-lists it, records it in ``repair``
   (:mod:`~hs_dataset.formats.repair_record`) and marks the build running: a damaged file
   left under its shard name would be adopted back by the next resume;
3. :func:`conclude`: once the build ran, every owed sample must be listed again; then the
   record is cleared and the moved-aside files deleted. Otherwise the record stays (so
   ``verify`` keeps failing) and the samples still missing are named.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from hs_dataset.errors import HsDatasetError
from hs_dataset.faults import crash_point
from hs_dataset.formats.atomic import fsync_dir, remove_quietly
from hs_dataset.formats.build_state import RUNNING
from hs_dataset.formats.manifest import Manifest
from hs_dataset.formats.paths import resolve_member
from hs_dataset.formats.reader import ShardReader
from hs_dataset.formats.repair_record import DAMAGED_SUFFIX, PendingRepair, ReplacedShard
from hs_dataset.formats.shard_file import shard_sample_ids
from hs_dataset.progress.task import task

__all__ = ["RepairOutcome", "conclude", "find_damaged", "take_out"]

_FIX_START = "; run `hs-dataset repair"  # where the reader's message turns to the fix (reader._repair_fix)


@dataclass
class RepairOutcome:
    """What a finished (or stopped) repair did: the shards taken out, where their samples are now, what is still owed."""

    replaced: tuple[ReplacedShard, ...] = ()
    now_in: list[str] = field(default_factory=list)  # shards that hold re-captured samples
    missing_ids: list[str] = field(default_factory=list)  # owed samples not stored again
    short: int = 0  # samples fewer than before the repair (owed samples of shards whose ids were unreadable)

    @property
    def complete(self) -> bool:
        return not self.missing_ids and not self.short

    @property
    def recaptured(self) -> int:
        return sum(s.samples for s in self.replaced) - len(self.missing_ids) - self.short


def find_damaged(root: Path, manifest: Manifest) -> list[ReplacedShard]:
    """Every listed shard a reader refuses (missing, truncated, hash mismatch, unparsable), with the ids it held where readable."""
    damaged = []
    shown = task("repair", "shards", len(manifest.shards), verb="checked")
    for index, record in enumerate(shown.track(manifest.shards, nbytes=lambda r: r.bytes)):
        path = resolve_member(root, record.file, what=f"shards[{index}].file")
        try:
            ShardReader(path, manifest=manifest, record=record, verify_hash=True)
        except (HsDatasetError, OSError) as exc:
            reason = (str(exc).splitlines() or [type(exc).__name__])[0].split(_FIX_START)[0]  # what is wrong; the fix is this repair
            damaged.append(ReplacedShard(record.file, record.samples, reason, _readable_ids(path, record.samples)))
    return damaged


def _readable_ids(path: Path, samples: int) -> tuple[str, ...] | None:
    """The ids the damaged file's header lists (or its moved-aside copy's), if it still parses and counts right."""
    for candidate in (path, path.with_name(path.name + DAMAGED_SUFFIX)):
        try:
            ids = shard_sample_ids(candidate)
        except (HsDatasetError, OSError, TypeError):
            continue
        if len(ids) == samples and all(isinstance(i, str) for i in ids):
            return tuple(ids)
    return None


def take_out(root: Path, manifest: Manifest, damaged: list[ReplacedShard]) -> Manifest:
    """Move the damaged files aside, then un-list them and record what they held, in one atomic manifest write.

    The caller holds the directory lock. The build is marked running: the dataset owes
    samples until the repair's build stores them again.
    """
    if manifest.build is None:
        raise ValueError("take_out needs a manifest that records its build (the caller refuses one without)")
    parents = set()
    for shard in damaged:
        path = resolve_member(root, shard.file, what="repair.shards[].file")
        if os.path.lexists(path):
            os.replace(path, path.with_name(path.name + DAMAGED_SUFFIX))
        parents.add(path.parent)
    for parent in parents:
        fsync_dir(parent)
    crash_point("repair.after_set_aside")  # the files moved aside, still listed: a re-run finds them missing
    listed_now = manifest.num_samples
    gone = {s.file for s in damaged}
    manifest.shards = [s for s in manifest.shards if s.file not in gone]
    manifest.repair = (manifest.repair or PendingRepair(0, ())).with_shards(damaged, listed_now)
    manifest.build = replace(manifest.build, state=RUNNING)
    manifest.save(root)
    return manifest


def conclude(root: Path, written_by_this_run: set[str]) -> RepairOutcome:
    """Check every owed sample is listed again; if so clear the record and delete the moved-aside files.

    ``written_by_this_run``: shards listed since the repair took the damaged ones out,
    named as holding the re-captured samples whose ids were unreadable. The caller holds
    the directory lock.
    """
    manifest = Manifest.load(root)
    pending = manifest.repair
    if pending is None:
        return RepairOutcome()
    holders: dict[str, str] = {}
    for record in manifest.shards:
        for sid in shard_sample_ids(resolve_member(root, record.file, what="shards[].file")):
            holders[sid] = record.file
    quarantined = {q.get("sample_id") for q in manifest.quarantine if isinstance(q, dict)}
    owed = [sid for shard in pending.shards for sid in shard.sample_ids or ()]
    missing = [sid for sid in owed if sid not in holders and sid not in quarantined]
    short = max(0, pending.samples_before - manifest.num_samples - len(missing))
    now_in = sorted({holders[sid] for sid in owed if sid in holders} | written_by_this_run)
    outcome = RepairOutcome(pending.shards, now_in, missing, short)
    if outcome.complete:
        manifest.repair = None
        manifest.save(root)
        _delete_set_aside(root, pending)
    return outcome


def _delete_set_aside(root: Path, pending: PendingRepair) -> None:
    """The damaged bytes, once every sample they held is stored again (never before)."""
    for shard in pending.shards:
        path = resolve_member(root, shard.file, what="repair.shards[].file")
        remove_quietly(path.with_name(path.name + DAMAGED_SUFFIX))
        fsync_dir(path.parent)

"""``hs-dataset merge URL... URL``: parts in object storage merged by writing one manifest, the last object written.

Parts that lie under the merged prefix (``s3://b/ds/rank-00003`` merged into
``s3://b/ds``) are not copied at all: the merged manifest names their shards by their
path below the prefix (``rank-00003/rank00003-shard-000000.safetensors``), with the
records (sizes, hashes, the part's dataset id) carried over as they are. Parts
elsewhere in the same store are copied server-side to ``part-<its dataset id>/``, and each copy's
size is checked. Until the manifest is written a reader of the prefix sees no dataset,
after it the whole merge: never half of one. The checks are the local merge's (same
identity, encodings and final norm; no part twice; no sample id in two parts, read from
the shard headers with two ranged reads each).

Killed (kill -9, a lost node) and run again, a merge finishes: before its first write
into a prefix without a manifest it claims the prefix (``hs_dataset-upload.json``, the
upload's claim, naming this merge by its parts), so a rerun knows the objects there as
its own leftovers and overwrites them, where another tool's objects are refused. Merging
again over an earlier merge never changes an object that merge's manifest lists: a
copy's name is its part's dataset id (a part's shard always lands at one name, whatever
the order of the parts), a copy that manifest already lists with the same hash is not
made again, and a ``file://`` copy goes through a temp name, so a reader meanwhile, or
after a kill, sees the earlier merge whole.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import replace
from pathlib import PurePosixPath

from hs_dataset.config.remote import RemoteOptions
from hs_dataset.errors import ForeignDatasetError, IntegrityError, UsageError
from hs_dataset.faults import crash_point
from hs_dataset.formats.build_state import merged_build, refuse_unfinished
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest, ShardRecord
from hs_dataset.formats.merge import check_compatible
from hs_dataset.remote.header import read_sample_ids
from hs_dataset.remote.location import RemoteLocation, open_location, storage_errors
from hs_dataset.remote.publish import claimed_by, remove_claim, write_claim
from hs_dataset.remote.transfer import put_bytes, temp_key

__all__ = ["merge_remote"]


def merge_remote(
    parts: list[str], out: str, *, check_ids: bool = True, options: RemoteOptions | None = None, allow_incomplete: bool = False
) -> Manifest:
    """Write ``out``'s manifest listing every part's shards (copied only when a part is not under ``out``).

    A part whose build has not finished is refused before anything is written unless ``allow_incomplete``.
    """
    if not parts:
        raise UsageError("merge needs at least one part")
    target = open_location(out, options)
    loaded = _load_parts([open_location(p, options) for p in parts], target)
    if not allow_incomplete:
        for part, (_loc, manifest) in zip(parts, loaded):
            refuse_unfinished(part, manifest, "merge")
    check_compatible([(PurePosixPath(loc.url), manifest) for loc, manifest in loaded])  # type: ignore[misc]
    if any(manifest.metadata.regeneration is not None for _loc, manifest in loaded):
        raise UsageError(f"{out}: parts built with --regenerate are merged locally only (hs-dataset merge DIR... DIR); download them first")
    merge_id = _merge_id(loaded)
    previous = _check_out(target, loaded, merge_id)
    listed = {record.file: record.digest for record in previous.shards} if previous is not None else {}
    claimed = previous is None and bool(_written_names(target, loaded))
    if claimed:
        write_claim(target, merge_id)  # before the first write: a rerun after a kill knows its leftovers
    shards: list[ShardRecord] = []
    quarantine: list[dict[str, str]] = []
    seen: dict[str, str] = {}
    for loc, manifest in loaded:
        prefix = _relative(loc, target) or _copy_prefix(manifest)
        for record in manifest.shards:
            if check_ids:
                _claim_ids(loc, record, seen)
            name = f"{prefix}/{record.file}"
            if _relative(loc, target) is None and not (listed.get(name) == record.digest and target.size(name) == record.bytes):
                _copy(loc, record.file, target, name, record.bytes)
                crash_point("merge.after_copy")
            shards.append(replace(record, file=name, dataset_id=record.dataset_id or manifest.dataset_id))
        quarantine.extend(manifest.quarantine)
    first_loc, first = loaded[0]
    _copy_norm(first_loc, first, target)
    crash_point("merge.before_manifest")
    merged = Manifest(
        dataset_id=uuid.uuid4().hex,
        metadata=first.metadata,
        tensors=first.tensors,
        shards=shards,
        quarantine=quarantine,
        created_by=first.created_by,
        identity=first.identity,
        build=merged_build([manifest.build for _, manifest in loaded]),
    )
    put_bytes(target, MANIFEST_NAME, merged.encode())
    if claimed:
        remove_claim(target)  # the manifest owns the prefix now; a kill before this leaves a claim nobody reads
    return merged


def _load_parts(locations: list[RemoteLocation], target: RemoteLocation) -> list[tuple[RemoteLocation, Manifest]]:
    loaded: list[tuple[RemoteLocation, Manifest]] = []
    for loc in locations:
        if type(loc.fs) is not type(target.fs):
            raise UsageError(f"{loc.url}: parts and the merged dataset must be in one store (the output is {target.url})")
        if loc.root == target.root:
            raise ForeignDatasetError(f"output {target.url} is the part {loc.url}; merge into the prefix above the parts")
        manifest = loc.require_manifest()
        for other, other_manifest in loaded:
            if other.root == loc.root or other_manifest.dataset_id == manifest.dataset_id:
                raise IntegrityError(f"{loc.url} and {other.url} are the same part (dataset id {manifest.dataset_id}); give each part once")
        loaded.append((loc, manifest))
    return loaded


def _relative(loc: RemoteLocation, target: RemoteLocation) -> str | None:
    """The part's path below the merged prefix (``rank-00003``), None when it is elsewhere."""
    head = target.root + "/"
    return loc.root[len(head) :] if loc.root.startswith(head) else None


def _check_out(target: RemoteLocation, loaded: list[tuple[RemoteLocation, Manifest]], merge_id: str) -> Manifest | None:
    """``out`` holds no dataset, or a previous merge of these parts (merging again replaces it): returns that merge's manifest.

    Without a manifest there, no object the merge would write (a copied shard, the norm
    weight) may exist yet, unless the prefix is claimed by this merge (a run of it that
    was killed left them): it would be another tool's, overwritten.
    """
    previous = target.manifest()
    if previous is None:
        ours = claimed_by(target) == merge_id
        for name in _written_names(target, loaded):
            if not ours and target.size(name) is not None:
                raise ForeignDatasetError(
                    f"{target.url}/{name}: already exists and no merged manifest lists it (another tool's object?); "
                    "nothing was written: merge into a new prefix"
                )
        return None
    ids = {manifest.dataset_id for _loc, manifest in loaded}
    if previous.identity != loaded[0][1].identity or not all(record.dataset_id in ids for record in previous.shards):
        raise ForeignDatasetError(f"{target.url} already holds another dataset (not a merge of these parts); merge into a new prefix")
    return previous


def _merge_id(loaded: list[tuple[RemoteLocation, Manifest]]) -> str:
    """The name of this merge in its claim: the same for the same parts (a rerun), in any order."""
    ids = sorted(manifest.dataset_id for _loc, manifest in loaded)
    return "merge-" + hashlib.sha256("\n".join(ids).encode()).hexdigest()[:32]


def _copy_prefix(manifest: Manifest) -> str:
    """Where a part elsewhere is copied: named by its dataset id, so one part's shard always lands at one name."""
    return f"part-{manifest.dataset_id}"


def _written_names(target: RemoteLocation, loaded: list[tuple[RemoteLocation, Manifest]]) -> list[str]:
    """The objects a merge writes under ``target``: the copies of parts that lie elsewhere, and the norm weight."""
    names: list[str] = []
    for loc, manifest in loaded:
        if _relative(loc, target) is None:
            names.extend(f"{_copy_prefix(manifest)}/{record.file}" for record in manifest.shards)
    norm_file = loaded[0][1].metadata.norm_weight_file
    if norm_file is not None:
        names.append(norm_file)
    return names


def _claim_ids(loc: RemoteLocation, record: ShardRecord, seen: dict[str, str]) -> None:
    """The shard's sample ids, from its header; one already claimed by another shard is an overlap of parts."""
    where = f"{loc.url}/{record.file}"
    for sid in read_sample_ids(loc, record):
        if sid in seen:
            raise IntegrityError(f"sample {sid!r} is in both {seen[sid]} and {where}; parts must not overlap")
        seen[sid] = where


def _copy(src: RemoteLocation, name: str, dst: RemoteLocation, dst_name: str, size: int) -> None:
    """A server-side copy, its size checked (its bytes are those the part's record hashes; verify checks them).

    An object store's copy appears whole; a ``file://`` copy is written to a temp name and renamed.
    """
    key = dst.key(dst_name)
    with storage_errors(f"{src.url}/{name}"):
        if dst.is_local:
            temp = temp_key(key)
            dst.fs.makedirs(key.rpartition("/")[0], exist_ok=True)
            dst.call("copy", src.key(name), temp)
            dst.fs.mv(temp, key)
        else:
            dst.call("copy", src.key(name), key)
    if dst.size(dst_name) != size:
        raise IntegrityError(f"{dst.url}/{dst_name}: the copy of {src.url}/{name} is not {size} bytes; merge again")


def _copy_norm(loc: RemoteLocation, manifest: Manifest, target: RemoteLocation) -> None:
    name = manifest.metadata.norm_weight_file
    if name is None:
        return
    size = loc.size(name)
    if size is None:
        raise IntegrityError(f"{loc.url}/{name}: the final-norm weight its manifest names is missing; rerun that part's build")
    _copy(loc, name, target, name, size)

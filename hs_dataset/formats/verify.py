"""``hs-dataset verify``: prove a dataset directory is complete and uncorrupted.

Checks, in order: the manifest parses and is of a known version and encoding;
every listed shard exists with the recorded size and hash (BLAKE3, or sha256 in
format-1 manifests; hashing.py, through the reader's check); no unlisted shard or
temp file lies beside them; each header parses, belongs to this dataset and has the
recorded dtypes and shapes; offsets span the tokens; loss masks match token counts;
no state holds NaN/inf; no sample id appears twice; the final-norm weight matches
its hash; each regenerated-conversations file the manifest lists is a plain file of
the recorded sha256 and record count, of valid records, whose kept conversations are
stored (or quarantined, cut by max_length, or a capture failure of its run report)
and whose dropped ones are not. The first failure names the shard (and sample where
there is one), or the file and the field.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hs_dataset.errors import HsDatasetError, IntegrityError
from hs_dataset.formats.atomic import is_temp_name
from hs_dataset.formats.build_state import BuildState
from hs_dataset.formats.encoding import all_finite, check_tensor_table
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest
from hs_dataset.formats.metadata import RegeneratedFile
from hs_dataset.formats.paths import check_local_path, open_regular, resolve_member
from hs_dataset.formats.reader import ShardReader, load_norm_weight
from hs_dataset.formats.regenerated import read_regenerated
from hs_dataset.formats.repair_record import repair_command
from hs_dataset.formats.shard_layout import INPUT_IDS_KEY, SHARD_NAME_RE
from hs_dataset.formats.vocabulary import check_token_ids, first_outside, vocab_size_of
from hs_dataset.progress.task import task

__all__ = ["VerifyResult", "check_finite", "verify_dataset"]

_STATE_CHUNK_TOKENS = 4096
_IDS_FIX = "the shard was altered after capture: restore it from the build or rebuild it"
_RUN_REPORT = "run_report.json"  # written by the pipeline beside the regenerated file (merge keeps them together)
_MAX_RUN_REPORT_BYTES = 64 * 1024 * 1024


@dataclass
class VerifyResult:
    samples: int = 0
    tokens: int = 0
    shards: int = 0
    bytes: int = 0
    problems: list[str] = field(default_factory=list)
    build: BuildState | None = None  # the manifest's build record: ``ok`` is about the bytes, ``finished`` about the build
    leftovers: list[str] = field(default_factory=list)  # an unfinished build's temp files and unlisted shards (see leftover)

    @property
    def ok(self) -> bool:
        return not self.problems

    def leftover(self, message: str) -> None:
        """A temp file or unlisted shard: a problem beside a finished dataset, expected beside an unfinished build.

        Why: a build that is running, or was killed, has shards in flight; its resume
        removes the temp files and adopts the shards, so they say nothing against what is stored.
        """
        (self.problems if self.finished else self.leftovers).append(message)

    @property
    def finished(self) -> bool:
        """False while the build that writes the dataset has not finished (no record: finished, see build_state)."""
        return self.build is None or self.build.finished

    def summary(self) -> str:
        return f"verified {self.samples} samples, {self.tokens} tokens, {self.shards} shards"


def verify_dataset(
    root: str | os.PathLike, *, check_hashes: bool = True, check_values: bool = True, max_problems: int = 20
) -> VerifyResult:
    """Run every check; collects up to ``max_problems`` problems instead of stopping at the first."""
    root = check_local_path(root, what="dataset")
    result = VerifyResult()
    try:
        manifest = Manifest.load(root)
        check_tensor_table(manifest.tensors, str(root / MANIFEST_NAME))
    except HsDatasetError as exc:
        result.problems.append(str(exc))
        return result
    result.build = manifest.build
    _check_pending_repair(root, manifest, result)
    _check_directory(root, manifest, result)
    seen: dict[str, str] = {}
    shown = task("verify", "shards", len(manifest.shards), verb="read")
    for index, record in enumerate(shown.track(manifest.shards, tokens=lambda r: r.tokens, nbytes=lambda r: r.bytes)):
        if len(result.problems) >= max_problems:
            break
        try:
            path = resolve_member(root, record.file, what=f"shards[{index}].file")
            _check_shard(root, path, manifest, record, seen, check_hashes, check_values)
        except (HsDatasetError, OSError) as exc:
            result.problems.append(str(exc))
            continue
        result.shards += 1
        result.samples += record.samples
        result.tokens += record.tokens
        result.bytes += record.bytes
    _check_norm_weight(root, manifest, result)
    complete = result.shards == len(manifest.shards)  # membership is only judged against every shard's ids
    _check_regenerated(root, manifest, result, set(seen) if complete else None)
    return result


def _check_directory(root: Path, manifest: Manifest, result: VerifyResult) -> None:
    listed = {Path(s.file).as_posix() for s in manifest.shards}
    if len(listed) != len(manifest.shards):
        result.problems.append(f"{root}: the manifest lists a shard file twice")
    for name in sorted(os.listdir(root)):
        if is_temp_name(name):
            result.leftover(f"{root / name}: leftover temp file from an interrupted write (resume the build to clean it)")
        elif SHARD_NAME_RE.match(name) and name not in listed:
            result.leftover(f"{root / name}: shard file not listed in the manifest (resume the build to adopt it)")


def _check_pending_repair(root: Path, manifest: Manifest, result: VerifyResult) -> None:
    """A repair that took shards out and has not seen their samples stored again: the dataset still owes them."""
    pending = manifest.repair
    if pending is None:
        return
    files = ", ".join(s.file for s in pending.shards)
    result.problems.append(
        f"{root / MANIFEST_NAME}: field repair: a repair took out {files} and has not seen their {pending.owed} sample(s) "
        f"stored again; run `{repair_command(root)}` to finish it"
    )


def _check_shard(root: Path, path: Path, manifest: Manifest, record, seen: dict[str, str], check_hashes: bool, check_values: bool) -> None:
    reader = ShardReader(path, manifest=manifest, record=record, verify_hash=check_hashes, dataset_root=root)
    for sid in reader.sample_ids:
        if sid in seen:
            raise IntegrityError(f"{path}: sample {sid!r} is also stored in {seen[sid]} (duplicate sample id)")
        seen[sid] = path.name
    check_ids(reader, path, vocab_size_of(manifest.metadata))
    if check_values:
        check_finite(reader, path)


def check_ids(reader: ShardReader, path: Path, vocab_size: int | None) -> None:
    """Every sample's input_ids inside the vocabulary the manifest records (a re-hashed shard passes the hashes)."""
    ids = reader.tensor(INPUT_IDS_KEY)
    found = first_outside(ids, vocab_size)
    if found is not None:
        i = int(torch.searchsorted(reader.offsets, torch.tensor(found[0]), right=True)) - 1
        begin, end = reader.token_range(i)
        check_token_ids(ids[begin:end], vocab_size, where=str(path), sample=reader.sample_ids[i], fix=_IDS_FIX)


def check_finite(reader: ShardReader, path: Path) -> None:
    """No NaN/inf in any state of the shard (remote verify runs it on each downloaded shard too)."""
    for key in reader.state_keys:
        data = reader.tensor(key)
        for start in range(0, data.shape[0], _STATE_CHUNK_TOKENS):
            chunk = data[start : start + _STATE_CHUNK_TOKENS]
            if all_finite(chunk):
                continue
            finite = torch.isfinite(chunk.float() if chunk.dtype == torch.float8_e4m3fn else chunk)
            if not bool(finite.all()):
                token = start + int((~finite).flatten(1).any(dim=1).nonzero()[0])
                sample = int(torch.searchsorted(reader.offsets, torch.tensor(token), right=True)) - 1
                raise IntegrityError(
                    f"{path}: sample {reader.sample_ids[sample]!r} has NaN/inf in {key} at token {token - int(reader.offsets[sample])}"
                )


def _check_norm_weight(root: Path, manifest: Manifest, result: VerifyResult) -> None:
    info = manifest.metadata.final_norm
    if info is None or info.weight_file is None:
        return
    try:
        load_norm_weight(root, info, where=str(root / MANIFEST_NAME), hidden_size=manifest.hidden_size)
    except FileNotFoundError:
        result.problems.append(f"{root / info.weight_file}: final-norm weight listed in the manifest is missing")
    except (HsDatasetError, OSError) as exc:
        result.problems.append(str(exc))


def _check_regenerated(root: Path, manifest: Manifest, result: VerifyResult, stored: set[str] | None) -> None:
    """Every file in ``metadata.regeneration.files``: safe path, sha256, record count, record shape, and what was stored."""
    where = str(root / MANIFEST_NAME)
    entry = manifest.metadata.regeneration
    if entry is None:
        return
    files = entry.files
    if not files:
        result.problems.append(
            f"{where}: metadata.regeneration.files is missing or empty: the build stopped before it hashed its regenerated "
            "conversations; resume the build (same command) to finish it"
        )
        return
    if entry.file is not None and entry.file not in files:
        result.problems.append(
            f"{where}: metadata.regeneration.file {entry.file!r} is not listed in metadata.regeneration.files; restore the original manifest"
        )
    owner: dict[str, str] = {}
    for name, info in files.items():
        field = f"metadata.regeneration.files[{name!r}]"
        try:
            path, records = _read_listed(root, name, info, field, where, vocab_size_of(manifest.metadata))
        except (HsDatasetError, OSError) as exc:
            result.problems.append(str(exc))
            continue
        twice = sorted(set(records) & set(owner))
        if twice:
            result.problems.append(
                f"{path}: {field} stores sample {twice[0]!r} that {owner[twice[0]]} also stores; each conversation is regenerated once"
            )
        owner.update(dict.fromkeys(records, name))
        if stored is not None:
            _check_stored(root, manifest, name, path, records, stored, result)


def _read_listed(
    root: Path, name: str, info: RegeneratedFile, field: str, where: str, vocab_size: int | None
) -> tuple[Path, dict[str, dict]]:
    """The file's records after checking its path, sha256, record count and ids (against ``vocab_size``, the
    vocabulary the manifest records) against the manifest."""
    path = resolve_member(root, name, what=field, where=where)
    try:
        records = read_regenerated(path, what=field, sha256=info.sha256, vocab_size=vocab_size)
    except FileNotFoundError:
        raise IntegrityError(
            f"{path}: {field} names a file that is missing; restore it (its sha256 is in {where}) or rebuild with --regenerate"
        ) from None
    count = info.records
    if count != len(records):
        raise IntegrityError(f"{path}: holds {len(records)} records but {field}.records is {count!r}; restore the file or the manifest")
    return path, records


def _check_stored(
    root: Path, manifest: Manifest, name: str, path: Path, records: dict[str, dict], stored: set[str], result: VerifyResult
) -> None:
    """Kept conversations are stored (or accounted for); dropped ones are not (what the regeneration stage guarantees)."""
    accounted = {q.get("sample_id") for q in manifest.quarantine if isinstance(q, dict)} | _capture_failures(root, name)
    max_length = manifest.metadata.max_length
    lost, leaked = [], []
    for sid, record in records.items():
        dropped = record["dropped"]
        if dropped is not None and not dropped.startswith("not regenerable"):
            leaked += [sid] if sid in stored else []
        elif sid not in stored and sid not in accounted and not _cut_by_max_length(record, max_length):
            lost.append(sid)
    if lost:
        result.problems.append(
            f"{path}: {len(lost)} kept conversation(s) of metadata.regeneration.files[{name!r}] are not in any shard, the "
            f"quarantine or the run report's capture_failures (first {lost[0]!r}); resume the build to capture them"
        )
    if leaked:
        result.problems.append(
            f"{path}: sample {leaked[0]!r} is stored although metadata.regeneration.files[{name!r}] records it as dropped; rebuild the dataset"
        )


def _cut_by_max_length(record: dict, max_length: object) -> bool:
    """True when no supervised token survives the length cut (the stage then stores nothing)."""
    limit = max_length if type(max_length) is int else float("inf")
    return record["input_ids"] is not None and not any(start < limit for start, _ in record["loss_spans"])


def _capture_failures(root: Path, name: str) -> set[str]:
    """Sample ids the run report beside ``name`` lists as capture failures (none when it is absent or unreadable)."""
    parent = name.rpartition("/")[0]
    try:
        path = resolve_member(root, f"{parent}/{_RUN_REPORT}" if parent else _RUN_REPORT, what="run report")
        with open_regular(path, what="run report") as f:
            runs = json.loads(f.read(_MAX_RUN_REPORT_BYTES)).get("runs")
    except (HsDatasetError, OSError, ValueError, AttributeError):
        return set()
    lists = [run.get("capture_failures") for run in runs if isinstance(run, dict)] if isinstance(runs, list) else []
    failures = [f for failed in lists if isinstance(failed, list) for f in failed if isinstance(f, dict)]
    return {f.get("sample_id") for f in failures if isinstance(f.get("sample_id"), str)}

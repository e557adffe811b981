"""``hs-dataset verify``: prove a dataset directory is complete and uncorrupted.

Checks, in order: the manifest parses and is of a known version and encoding;
every listed shard exists with the recorded size and sha256; no unlisted shard or
temp file lies beside them; each header parses, belongs to this dataset and has the
recorded dtypes and shapes; offsets span the tokens; loss masks match token counts;
no state holds NaN/inf; no sample id appears twice; the final-norm weight matches
its hash. The first failure names the shard (and sample where there is one).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hs_dataset.errors import HsDatasetError, IntegrityError
from hs_dataset.formats.atomic import is_temp_name
from hs_dataset.formats.encoding import all_finite, check_tensor_table
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest
from hs_dataset.formats.paths import resolve_member
from hs_dataset.formats.reader import ShardReader, load_norm_weight
from hs_dataset.formats.shard_layout import SHARD_NAME_RE

__all__ = ["VerifyResult", "verify_dataset"]

_STATE_CHUNK_TOKENS = 4096


@dataclass
class VerifyResult:
    samples: int = 0
    tokens: int = 0
    shards: int = 0
    bytes: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        return f"verified {self.samples} samples, {self.tokens} tokens, {self.shards} shards"


def verify_dataset(root: str | os.PathLike, *, check_hashes: bool = True, check_values: bool = True, max_problems: int = 20) -> VerifyResult:
    """Run every check; collects up to ``max_problems`` problems instead of stopping at the first."""
    root = Path(root)
    result = VerifyResult()
    try:
        manifest = Manifest.load(root)
        check_tensor_table(manifest.tensors, str(root / MANIFEST_NAME))
    except HsDatasetError as exc:
        result.problems.append(str(exc))
        return result
    _check_directory(root, manifest, result)
    seen: dict[str, str] = {}
    for index, record in enumerate(manifest.shards):
        if len(result.problems) >= max_problems:
            break
        try:
            path = resolve_member(root, record.file, what=f"shards[{index}].file")
            _check_shard(path, manifest, record, seen, check_hashes, check_values)
        except (HsDatasetError, OSError) as exc:
            result.problems.append(str(exc))
            continue
        result.shards += 1
        result.samples += record.samples
        result.tokens += record.tokens
        result.bytes += record.bytes
    _check_norm_weight(root, manifest, result)
    return result


def _check_directory(root: Path, manifest: Manifest, result: VerifyResult) -> None:
    listed = {Path(s.file).as_posix() for s in manifest.shards}
    if len(listed) != len(manifest.shards):
        result.problems.append(f"{root}: the manifest lists a shard file twice")
    for name in sorted(os.listdir(root)):
        if is_temp_name(name):
            result.problems.append(f"{root / name}: leftover temp file from an interrupted write (resume the build to clean it)")
        elif SHARD_NAME_RE.match(name) and name not in listed:
            result.problems.append(f"{root / name}: shard file not listed in the manifest (resume the build to adopt it)")


def _check_shard(path: Path, manifest: Manifest, record, seen: dict[str, str], check_hashes: bool, check_values: bool) -> None:
    reader = ShardReader(path, manifest=manifest, record=record, verify_hash=check_hashes)
    for sid in reader.sample_ids:
        if sid in seen:
            raise IntegrityError(f"{path}: sample {sid!r} is also stored in {seen[sid]} (duplicate sample id)")
        seen[sid] = path.name
    if check_values:
        _check_finite(reader, path)


def _check_finite(reader: ShardReader, path: Path) -> None:
    from hs_dataset.formats.shard_layout import AUX_KEY, FINAL_KEY

    for key in (AUX_KEY, FINAL_KEY):
        data = reader.tensor(key)
        for start in range(0, data.shape[0], _STATE_CHUNK_TOKENS):
            chunk = data[start : start + _STATE_CHUNK_TOKENS]
            if all_finite(chunk):
                continue
            finite = torch.isfinite(chunk.float() if chunk.dtype == torch.float8_e4m3fn else chunk)
            if not bool(finite.all()):
                token = start + int((~finite).flatten(1).any(dim=1).nonzero()[0])
                sample = int(torch.searchsorted(reader.offsets, torch.tensor(token), right=True)) - 1
                raise IntegrityError(f"{path}: sample {reader.sample_ids[sample]!r} has NaN/inf in {key} at token {token - int(reader.offsets[sample])}")


def _check_norm_weight(root: Path, manifest: Manifest, result: VerifyResult) -> None:
    info = manifest.metadata.get("final_norm") or {}
    if "weight_file" not in info:
        return
    try:
        load_norm_weight(root, info, where=str(root / MANIFEST_NAME), hidden_size=manifest.hidden_size)
    except FileNotFoundError:
        result.problems.append(f"{root / str(info['weight_file'])}: final-norm weight listed in the manifest is missing")
    except (HsDatasetError, OSError) as exc:
        result.problems.append(str(exc))

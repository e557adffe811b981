"""The manifest's ``repair`` record: shards taken out of a dataset to be captured again, until their samples are back.

Why in the manifest: un-listing a damaged shard and recording what it held must be one
atomic write, so a kill -9 at any instant leaves either the shard listed (a re-run of
``hs-dataset repair`` finds it damaged again) or the record that says which samples the
dataset still owes. Without it, a repair stopped after the un-listing could not tell a
re-captured sample from one the source no longer yields: data would be lost silently.

``repair`` = ``{"samples_before": N, "shards": [{"file", "samples", "reason", "sample_ids"}]}``.
``samples_before`` is the samples the manifest listed before the first shard was taken
out; ``sample_ids`` is null where the shard's header could not be read (a missing file).
The record is cleared once every owed sample is stored again; a dataset without it has
no repair in progress.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hs_dataset.errors import FormatError

__all__ = ["DAMAGED_SUFFIX", "PendingRepair", "ReplacedShard", "repair_command"]

DAMAGED_SUFFIX = ".damaged"  # a damaged shard's bytes, moved aside until its samples are stored again


def repair_command(root: str | Path) -> str:
    """The exact command that repairs ``root`` (what verify, the reader and a refused resume print)."""
    return f"hs-dataset repair {shlex.quote(str(root))}"


@dataclass(frozen=True)
class ReplacedShard:
    """One shard taken out of the manifest: its name, the samples it held, why it was taken out."""

    file: str
    samples: int
    reason: str
    sample_ids: tuple[str, ...] | None = None  # None: unreadable (missing), only its count is known

    def to_json(self) -> dict[str, Any]:
        ids = None if self.sample_ids is None else list(self.sample_ids)
        return {"file": self.file, "samples": self.samples, "reason": self.reason, "sample_ids": ids}

    @classmethod
    def from_json(cls, raw: Any, where: str, index: int) -> ReplacedShard:
        field = f"repair.shards[{index}]"
        ids = raw.get("sample_ids") if isinstance(raw, dict) else None
        if (
            not isinstance(raw, dict)
            or not isinstance(raw.get("file"), str)
            or not isinstance(raw.get("reason"), str)
            or not _is_count(raw.get("samples"))
            or not (ids is None or (isinstance(ids, list) and all(isinstance(i, str) for i in ids)))
        ):
            raise FormatError(f"{where}: {field} must hold file, samples, reason and sample_ids (a list or null); restore the manifest")
        return cls(raw["file"], raw["samples"], raw["reason"][:2000], None if ids is None else tuple(ids))


@dataclass(frozen=True)
class PendingRepair:
    """The shards a repair took out and the samples listed before it: what the dataset owes until it is whole."""

    samples_before: int
    shards: tuple[ReplacedShard, ...]

    @property
    def owed(self) -> int:
        """Samples the taken-out shards held."""
        return sum(s.samples for s in self.shards)

    def with_shards(self, more: list[ReplacedShard], listed_now: int) -> PendingRepair:
        """This record with ``more`` shards taken out, ``listed_now`` the samples the manifest lists before they are."""
        return PendingRepair(max(self.samples_before, listed_now), self.shards + tuple(more))

    def to_json(self) -> dict[str, Any]:
        return {"samples_before": self.samples_before, "shards": [s.to_json() for s in self.shards]}

    @classmethod
    def from_json(cls, raw: Any, where: str) -> PendingRepair:
        if not isinstance(raw, dict) or not _is_count(raw.get("samples_before")) or not isinstance(raw.get("shards"), list):
            raise FormatError(f"{where}: repair must hold samples_before and a list of shards; restore the manifest")
        return cls(raw["samples_before"], tuple(ReplacedShard.from_json(s, where, i) for i, s in enumerate(raw["shards"])))


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0

"""What happened to every input row: counts plus one issue record per row not turned into a sample.

A row that yields no sample must never vanish silently: it is either a sample, an
id skipped because it is already stored, a too-long row dropped by policy, or an
issue with its row index (and, for files, the file and line) and a reason a person
can act on. Bad rows are counted, never fatal (unless ``strict``): a resume reads
past them again and stops nowhere.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

from hs_dataset.errors import SourceError

__all__ = ["IssueKind", "MalformedRowError", "OversizedRowError", "RowIssue", "SourceReport"]

IssueKind = Literal["malformed", "oversized", "no_supervised_token", "dropped_too_long"]


class MalformedRowError(SourceError):
    """One row is unusable; ``iter_samples`` records it (or re-raises it in strict mode)."""


class OversizedRowError(MalformedRowError):
    """One row is over the line or character cap and cannot be cut exactly; reported as ``oversized``."""


@dataclass(frozen=True)
class RowIssue:
    """One row that produced no sample, and why."""

    row_index: int
    kind: IssueKind
    reason: str
    sample_id: str | None = None
    file: str | None = None
    line: int | None = None

    def describe(self, source_name: str) -> str:
        who = f" ({self.sample_id})" if self.sample_id else ""
        where = f" [{self.file}:{self.line}]" if self.file and self.line else (f" [{self.file}]" if self.file else "")
        return f"{source_name}: row {self.row_index}{who}{where}: {self.kind}: {self.reason}"


@dataclass
class SourceReport:
    """Counters for one pass over a source; filled in while ``iter_samples`` runs."""

    source_name: str = ""
    rows_read: int = 0
    samples_out: int = 0
    truncated: int = 0
    skipped_existing: int = 0
    pretokenized_default_mask: int = 0
    char_capped: int = 0
    shapes: dict[str, int] = field(default_factory=dict)  # conversation shape -> rows (docs/SOURCES.md)
    unknown_keys: dict[str, int] = field(default_factory=dict)  # sorted keys of unknown-shape rows -> rows
    total_rows: int | None = None  # rows the source holds, when it knows (progress bars)
    issues: list[RowIssue] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add_issue(self, issue: RowIssue) -> None:
        self.issues.append(issue)

    def count_shape(self, shape: str, keys: list[str] | None = None) -> None:
        """Count one row's shape; an unknown row also counts its key set, so the fix (``--columns``) is visible."""
        self.shapes[shape] = self.shapes.get(shape, 0) + 1
        if keys is not None:
            name = ",".join(sorted(keys)[:20])
            self.unknown_keys[name] = self.unknown_keys.get(name, 0) + 1

    def add_note(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)

    def _of(self, kind: IssueKind) -> dict[int, str]:
        return {i.row_index: i.reason for i in self.issues if i.kind == kind}

    @property
    def malformed(self) -> dict[int, str]:
        """Row index -> reason, for rows that could not be read or rendered."""
        return self._of("malformed")

    @property
    def oversized(self) -> dict[int, str]:
        """Row index -> reason, for rows over the line or character caps that could not be cut exactly."""
        return self._of("oversized")

    @property
    def no_supervised_token(self) -> dict[int, str]:
        """Row index -> reason, for rows whose loss mask is all False."""
        return self._of("no_supervised_token")

    @property
    def dropped_too_long(self) -> dict[int, str]:
        """Row index -> reason, for rows longer than max_length under ``overflow="drop"``."""
        return self._of("dropped_too_long")

    def counts(self) -> dict[str, int]:
        return {
            "rows_read": self.rows_read,
            "samples_out": self.samples_out,
            "truncated": self.truncated,
            "dropped_too_long": len(self.dropped_too_long),
            "no_supervised_token": len(self.no_supervised_token),
            "malformed": len(self.malformed),
            "oversized": len(self.oversized),
            "skipped_existing": self.skipped_existing,
            "pretokenized_default_mask": self.pretokenized_default_mask,
            "char_capped": self.char_capped,
        }

    def to_dict(self) -> dict:
        """JSON-ready form (for logs and the dataset card)."""
        return {
            "source_name": self.source_name,
            **self.counts(),
            "shapes": dict(self.shapes),
            "unknown_keys": dict(self.unknown_keys),
            "issues": [asdict(i) for i in self.issues],
            "notes": list(self.notes),
        }

    def summary(self) -> str:
        parts = ", ".join(f"{k}={v}" for k, v in self.counts().items() if v or k in ("rows_read", "samples_out"))
        return f"{self.source_name}: {parts}"

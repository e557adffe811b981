"""The run report of a build: every input row accounted for, shown as a summary and kept in ``run_report.json``."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hs_dataset.formats.atomic import atomic_write_bytes
from hs_dataset.formats.writer_session import WriterReport
from hs_dataset.sources.report import SourceReport

__all__ = ["RUN_REPORT_NAME", "RunReport", "save_run_report"]

RUN_REPORT_NAME = "run_report.json"


@dataclass
class RunReport:
    """What a build did: every input row is accounted for somewhere in here."""

    config: str
    out_dir: str
    samples_considered: int = 0
    samples_written: int = 0
    skipped_existing: int = 0
    tokens_written: int = 0
    bytes_written: int = 0
    truncated: int = 0
    capture_failures: list[dict[str, str]] = field(default_factory=list)
    quarantined: list[dict[str, str]] = field(default_factory=list)
    rejected_shards: list[str] = field(default_factory=list)
    source: dict[str, Any] = field(default_factory=dict)
    regeneration: dict[str, Any] | None = None
    elapsed_s: float = 0.0
    rank: int = 0
    world_size: int = 1
    dataset_id: str = ""  # the dataset the run wrote into, and its identity: what a reader of it checks it serves
    identity: str = ""

    @property
    def samples_per_s(self) -> float:
        return self.samples_written / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_written / self.elapsed_s if self.elapsed_s else 0.0

    def take_writer(self, writer: WriterReport) -> None:
        """The writer's counts: written samples and bytes, quarantines, rejected foreign shards."""
        self.samples_written = writer.written
        self.bytes_written = writer.bytes_written
        self.quarantined = list(writer.quarantined)
        self.rejected_shards = list(writer.rejected_shards)

    def take_source(self, report: SourceReport) -> None:
        """The source stage's counts: rows read, samples out, each dropped row, the shapes seen."""
        self.truncated = report.truncated
        self.source = {
            "name": report.source_name,
            "rows_read": report.rows_read,
            "samples_out": report.samples_out,
            "truncated": report.truncated,
            "issues": [asdict(i) for i in report.issues],
            "notes": list(report.notes),
            "shapes": dict(report.shapes),
            "unknown_keys": dict(report.unknown_keys),
        }

    def not_written(self) -> Counter[str]:
        """Why rows were not written, counted once: each source issue by kind, each capture failure, each quarantine."""
        kinds = [issue["kind"] for issue in self.source.get("issues", [])]
        kinds += ["capture_failed"] * len(self.capture_failures) + ["quarantined_nonfinite"] * len(self.quarantined)
        return Counter(kinds)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "samples_per_s": round(self.samples_per_s, 3), "tokens_per_s": round(self.tokens_per_s, 1)}

    def summary(self) -> str:
        src = self.source
        reasons = self.not_written()
        lines = [
            f"run report for {self.config} -> {self.out_dir}",
            f"  rows read            {src.get('rows_read', 0)}",
            f"  samples written      {self.samples_written} ({self.tokens_written} tokens, {self.bytes_written / 2**20:.1f} MiB)",
            f"  already stored       {self.skipped_existing}",
            f"  truncated            {self.truncated}",
            f"  not written          {sum(reasons.values())}"
            + (f" ({', '.join(f'{k}: {v}' for k, v in sorted(reasons.items()))})" if reasons else ""),
            f"  time                 {self.elapsed_s:.1f} s ({self.samples_per_s:.2f} samples/s, {self.tokens_per_s:.0f} tokens/s)",
        ]
        if self.regeneration:
            r = self.regeneration
            lines.append(
                f"  regenerated          {r['conversations']} conversations, {r['turns']} turns ({r.get('regenerated', 0)} by this run, "
                f"{r.get('generated_tokens', 0)} tokens; {r['from_store']} from the stored file): "
                f"hit max_new_tokens {r['hit_max_new_tokens']}, empty {r['empty']}, failed {r['failed']}, dropped {r['dropped']}, "
                f"not regenerable {r['not_regenerable']}, unsupervised turns {r['unsupervised_turns']}"
            )
            lines.append(_answers_line(r))
        return "\n".join(lines + self._details())

    def _details(self) -> list[str]:
        """The shapes seen, then the first few of each kind of problem, one line each."""
        src = self.source
        lines = []
        if src.get("shapes"):
            lines.append("  shapes               " + ", ".join(f"{k}: {v}" for k, v in sorted(src["shapes"].items())))
        for keys, n in list((src.get("unknown_keys") or {}).items())[:5]:
            lines.append(f"    unknown shape, keys [{keys}]: {n} row(s) (map them with --columns)")
        for issue in src.get("issues", [])[:10]:
            lines.append(f"    row {issue['row_index']}: {issue['kind']}: {issue['reason']}")
        for failure in self.capture_failures[:10]:
            lines.append(f"    {failure['sample_id']}: capture failed: {failure['reason']}")
        for q in self.quarantined[:10]:
            lines.append(f"    {q['sample_id']}: quarantined: {q['reason']}")
        for name in self.rejected_shards:
            lines.append(f"    {name}: unlisted shard of another dataset, renamed to {name}.rejected")
        return lines


def save_run_report(out_dir: Path, report: RunReport) -> None:
    """Append the report to ``run_report.json`` (one entry per run: a resumed build keeps the earlier runs)."""
    path = out_dir / RUN_REPORT_NAME
    runs: list[Any] = []
    if path.exists():
        try:
            runs = json.loads(path.read_text()).get("runs", [])
        except (ValueError, AttributeError):
            runs = []
    runs.append(report.to_json())
    atomic_write_bytes(path, json.dumps({"runs": runs}, indent=1).encode())


def _answers_line(r: dict[str, Any]) -> str:
    """What was cut off the generators' answers and which were refused, by kind (``regenerate/answers.py``)."""
    malformed = r.get("malformed") or {}
    refused = ", ".join(f"{kind}: {n}" for kind, n in sorted(malformed.items()))
    return (
        f"  answers cut          after their stop id {r.get('cut_after_stop', 0)}, at max_new_tokens {r.get('cut_at_max_new_tokens', 0)}; "
        f"refused as malformed {sum(malformed.values())}" + (f" ({refused})" if refused else "")
    )

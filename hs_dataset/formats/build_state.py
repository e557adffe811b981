"""Whether a dataset's build finished: the manifest's ``build`` record, and the lines that tell a person.

Why the manifest: it is the one file rewritten atomically after every shard and read
(and pushed, merged, uploaded last) by every command, so the record can never disagree
with the shards it counts. ``run_report.json`` is written only at the very end and
travels nowhere; its absence alone told nobody that a kill -9 left half a dataset.

``build`` = ``{"state": "running" | "finished", "samples_expected": N | null,
"command": "hs-dataset build ..." | null, "cwd": DIR | null}``. A build writes
``running`` with the samples it expects and the command that resumes it as it opens the
directory, and ``finished`` in the same atomic manifest write that follows its last
shard. ``samples_expected`` is the rows the build will read (an upper bound: rows the
source drops are never stored), null where that is unknown without a pass over the source.

A manifest without the record (written before hs_dataset recorded it, or not by a build:
``ShardWriter`` used directly, ``import``, a stream cache) is treated as finished:
nothing on disk tells its state, and refusing every older dataset would strand it.
``info`` says "not recorded" and, for a build that may have been killed, to re-run it.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, replace
from typing import Any, Protocol

from hs_dataset.errors import ALLOW_INCOMPLETE, FormatError, IncompleteDatasetError

__all__ = [
    "FINISHED",
    "NOT_RECORDED",
    "RUNNING",
    "BuildState",
    "merged_build",
    "progress_phrase",
    "refuse_unfinished",
    "resume_hint",
    "unfinished_line",
]

RUNNING = "running"
FINISHED = "finished"
MAX_COMMAND_CHARS = 16_384  # a command line; bounds what a hostile manifest makes us print
NOT_RECORDED = (
    "not recorded (written before hs_dataset recorded it, or not by `hs-dataset build`): treated as finished; "
    "if its build was interrupted, re-run that build command to resume it"
)


@dataclass(frozen=True)
class BuildState:
    """The ``build`` record of a manifest: running or finished, the samples expected, the command that resumes it."""

    state: str
    samples_expected: int | None = None
    command: str | None = None
    cwd: str | None = None

    @property
    def finished(self) -> bool:
        return self.state == FINISHED

    def as_finished(self) -> BuildState:
        """The record a build writes once its last shard is listed."""
        return replace(self, state=FINISHED)

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "samples_expected": self.samples_expected, "command": self.command, "cwd": self.cwd}

    @classmethod
    def from_json(cls, raw: Any, where: str) -> BuildState:
        """The record as read, each field checked (a manifest is untrusted input)."""
        if not isinstance(raw, dict) or raw.get("state") not in (RUNNING, FINISHED):
            raise FormatError(f"{where}: build.state must be {RUNNING!r} or {FINISHED!r}, got {str(raw)[:80]}; restore the manifest")
        expected = raw.get("samples_expected")
        if expected is not None and (isinstance(expected, bool) or not isinstance(expected, int) or expected < 0):
            raise FormatError(f"{where}: build.samples_expected must be a non-negative integer or null; restore the manifest")
        return cls(raw["state"], expected, _text(raw.get("command"), where, "command"), _text(raw.get("cwd"), where, "cwd"))


def _text(value: Any, where: str, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_COMMAND_CHARS or "\n" in value:
        raise FormatError(f"{where}: build.{name} must be one line of text or null; restore the manifest")
    return value


def merged_build(parts: list[BuildState | None]) -> BuildState | None:
    """The record of a merge of ``parts``: unfinished if any part is, so ``merge --allow-incomplete`` does not hide it.

    No command resumes a merge; its parts' builds do. None where no part records its build.
    """
    if all(part is None for part in parts):
        return None
    expected = [part.samples_expected if part is not None else None for part in parts]
    total = None if any(e is None for e in expected) else sum(e for e in expected if e is not None)
    state = FINISHED if all(part is None or part.finished for part in parts) else RUNNING
    return BuildState(state, total)


def progress_phrase(stored: int, expected: int | None) -> str:
    """``413 of 1000 samples stored``, or ``413 samples stored (total unknown)``."""
    if expected is None:
        return f"{stored} samples stored (total unknown)"
    return f"{stored} of {expected} samples stored"


def resume_hint(state: BuildState) -> str:
    """The command that resumes the build, run from its directory where that is not the current one."""
    if not state.command:
        return "re-run the builds that wrote it (merged parts: finish each part's build, then merge again)"
    if state.cwd and os.path.abspath(state.cwd) != os.getcwd():
        return f"cd {shlex.quote(state.cwd)} && {state.command}"
    return state.command


def unfinished_line(where: str, stored: int, state: BuildState | None) -> str | None:
    """The first line ``verify`` and ``info`` print for an unfinished build; None for a finished (or unrecorded) one."""
    if state is None or state.finished:
        return None
    return f"unfinished build: {progress_phrase(stored, state.samples_expected)} in {where}; re-run the same command to resume: {resume_hint(state)}"


class _Recorded(Protocol):
    """What the refusal reads of a manifest (``formats/manifest.py`` imports this module, so not the class itself)."""

    @property
    def num_samples(self) -> int: ...

    @property
    def build(self) -> BuildState | None: ...


def refuse_unfinished(where: str | os.PathLike[str], manifest: _Recorded, verb: str) -> None:
    """Raise :class:`IncompleteDatasetError` (one line: the dataset, how much is stored, the resume command, the override)
    for an unfinished build; nothing for a finished or unrecorded one.

    Why here: ``push_to_hub``, the exports and the merges call it unless given ``allow_incomplete=True``, and the CLI
    only passes its ``--allow-incomplete`` on, so a script and a command refuse the same datasets with the same line.
    """
    build = manifest.build
    if build is None or build.finished:
        return
    raise IncompleteDatasetError(
        f"{os.fspath(where)}: unfinished build ({progress_phrase(manifest.num_samples, build.samples_expected)}; "
        f"manifest.json build.state is {build.state!r}): resume it with `{resume_hint(build)}`, "
        f"or pass {ALLOW_INCOMPLETE} (allow_incomplete=True in Python) to {verb} it as it is"
    )

"""The source patch that adds hidden-state capture to SGLang <= 0.5.5 (DeepseekV2/V3): render, check, apply, revert.

SGLang before 0.5.9 has no forward hooks, plugins or external model packages, so
the only way to see the residual stream of ``DeepseekV2Model`` is to edit
``sglang/srt/models/deepseek_v2.py``.  This module does that edit safely:

* anchors are found by parsing the file (class ``DeepseekV2Model``, its
  ``forward``, the decoder-layer loop, the final ``self.norm`` call, the final
  ``return``), never by line number, and anything missing or ambiguous is refused;
* three one-line statements go into ``forward`` and one helper block before the
  class; every inserted line carries the marker, so the edit can be found again;
* the original's sha256 is written into the patch header and into a backup file,
  and ``revert`` restores the original byte for byte (or refuses);
* files are written atomically (temp file, fsync, rename) after ``compile()``.

With ``HS_CAPTURE_STAGING_DIR`` unset the patched forward does what the original
does.  The contract with the capture hook is described in docs/LEGACY_PATCH.md.

The parts: :mod:`.anchors` (where the patch goes), :mod:`.inserted` (what it
inserts), this module (render, check, apply, revert), :mod:`.locate` (finding the
installed file) and :mod:`.patch` (the command line, also run as a script).

These modules use only the standard library: they run in the SGLang server's
environment, where hs_dataset may not be installed (see :mod:`.patch`).
"""

from __future__ import annotations

import enum
import hashlib
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hs_dataset.errors import HsDatasetError
from hs_dataset.server_patch.contract.legacy_header import BEGIN, PATCH_VERSION
from hs_dataset.server_patch.legacy.anchors import Anchors, UnrecognisedSource, recognise, split_lines
from hs_dataset.server_patch.legacy.inserted import (
    ANY_MARK,
    BEGIN_RE,
    END,
    HELPER,
    MARKER,
    STMT_BEGIN,
    STMT_CAPTURE,
    STMT_EMIT,
)

__all__ = [
    "KNOWN_ORIGINALS",
    "LegacyPatchError",
    "PatchState",
    "PatchStatus",
    "apply",
    "backup_path",
    "check",
    "check_text",
    "patch_text",
    "read_source",
    "revert",
]

# sha256 of deepseek_v2.py as shipped in the wheels the patch was tested on
# (scripts/fetch_sglang_sources.sh); other files are patched if their structure
# is recognised, and reported as untested.
KNOWN_ORIGINALS: dict[str, str] = {
    "7b6f274a7e8d26af5896c6c958faa8b4828126beba67d5f204f064e382b46b3c": "0.4.10.post2",
    "9f1a879f58f16f41434ccbcbeadbf36b501460e63bbf2808ae5abc37706e0674": "0.5.5",
    "620cd09545404fd62952e2239b905cfb26bc7565b361ac76bdf8f6d89ca80f49": "0.5.5.post3",
    "1f37d7714ccd20b37bceec3c451977ba3d196117b937d5f996723faa96537036": "0.5.8.post1",
}

_HOOKS_ADVICE = (
    "This patch only understands SGLang <= 0.5.5-style DeepseekV2Model.forward "
    "(explicit `residual` returned by each decoder layer). For SGLang 0.5.9+ use the "
    "hooks mechanism instead (`hs-dataset serve`, --forward-hooks); do not patch."
)


class LegacyPatchError(HsDatasetError):
    """The patch cannot be checked, applied or reverted; the message says why and what to do."""


class PatchState(str, enum.Enum):
    UNPATCHED = "unpatched"  # original source, anchors recognised: apply will work
    PATCHED = "patched"  # exactly our patch on top of a recognised original
    MODIFIED = "modified"  # our markers are there but the file changed since patching
    UNRECOGNISED = "unrecognised"  # anchors missing/ambiguous, or a foreign patch version


@dataclass
class PatchStatus:
    """What `check` found; `reason` is meant for people (what is wrong, what to do)."""

    path: str
    state: PatchState
    reason: str
    original_sha256: str | None = None
    known_version: str | None = None  # SGLang release the original matches, if any
    anchors: dict[str, int] = field(default_factory=dict)  # anchor -> line in the original

    @property
    def recognised(self) -> bool:
        return self.state in (PatchState.UNPATCHED, PatchState.PATCHED)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["state"] = self.state.value
        return data


# --------------------------------------------------------------------------- text


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _newline(lines: list[str]) -> str:
    return "\r\n" if lines and lines[0].endswith("\r\n") else "\n"


def _render(text: str, anchors: Anchors) -> str:
    """Original text plus the marked insertions."""
    lines = split_lines(text)
    nl = _newline(lines)
    original_sha = _sha256(text.encode("utf-8"))

    def stmt(line_index: int, code: str) -> list[str]:
        line = lines[line_index]
        indent = line[: len(line) - len(line.lstrip(" \t"))]
        return [f"{indent}{code}  {MARKER}{nl}"]

    helper = [f"{BEGIN}{original_sha} (added by `hs-dataset patch apply`; undo: `hs-dataset patch revert`){nl}"]
    helper += [f"{h}{nl}" if h else nl for h in HELPER.split("\n")[:-1]]
    helper += [f"{END}{nl}"]
    inserts = {
        anchors.helper_line: helper,
        anchors.begin_line: stmt(anchors.begin_line, STMT_BEGIN),
        anchors.capture_line: stmt(anchors.capture_line, STMT_CAPTURE.format(i=anchors.loop_var)),
        anchors.emit_line: stmt(anchors.emit_line, STMT_EMIT),
    }
    if len(inserts) != 4:
        raise UnrecognisedSource("two anchors share a line")
    out: list[str] = []
    for index, line in enumerate(lines):
        out.extend(inserts.get(index, []))
        out.append(line)
    return "".join(out)


def patch_text(text: str) -> str:
    """Patched version of an unpatched source text; raises LegacyPatchError if unrecognised."""
    if ANY_MARK in text:
        raise LegacyPatchError("the source already contains hs_dataset-patch markers; check it first")
    try:
        patched = _render(text, recognise(text))
    except UnrecognisedSource as exc:
        raise LegacyPatchError(f"unrecognised deepseek_v2.py: {exc}. {_HOOKS_ADVICE}") from None
    compile(patched, "<patched deepseek_v2.py>", "exec")
    return patched


def _strip(text: str) -> tuple[str, str, int]:
    """Remove our marked lines: (original text, recorded sha256, patch version)."""
    kept: list[str] = []
    header: re.Match | None = None
    inside = False
    for line in split_lines(text):
        bare = line.rstrip("\r\n")
        if inside:
            if bare.startswith("# <<< hs_dataset-patch v"):
                inside = False
            continue
        match = BEGIN_RE.match(bare)
        if match:
            if header is not None:
                raise UnrecognisedSource("more than one hs_dataset patch header")
            header, inside = match, True
            continue
        if re.search(r"  # hs_dataset-patch v\d+$", bare):
            continue
        if ANY_MARK in bare:
            raise UnrecognisedSource(f"unexpected hs_dataset-patch marker in {bare.strip()[:80]!r}")
        kept.append(line)
    if header is None or inside:
        raise UnrecognisedSource("hs_dataset patch header missing or its block is not closed")
    return "".join(kept), header.group(2), int(header.group(1))


# --------------------------------------------------------------------------- check


def check_text(text: str, path: str = "<text>") -> PatchStatus:
    """Classify a source text; never raises for bad input (the reason says why)."""
    if ANY_MARK not in text:
        sha = _sha256(text.encode("utf-8"))
        try:
            anchors = recognise(text)
        except UnrecognisedSource as exc:
            return PatchStatus(path, PatchState.UNRECOGNISED, f"{exc}. {_HOOKS_ADVICE}", sha)
        return PatchStatus(
            path,
            PatchState.UNPATCHED,
            _tested_note(sha, "not patched; anchors recognised"),
            sha,
            KNOWN_ORIGINALS.get(sha),
            anchors.report,
        )
    try:
        original, recorded, version = _strip(text)
    except UnrecognisedSource as exc:
        return PatchStatus(
            path, PatchState.UNRECOGNISED, f"damaged hs_dataset patch: {exc}; restore the file from its backup or reinstall sglang"
        )
    if version < PATCH_VERSION and _sha256(original.encode("utf-8")) == recorded:
        # An older patch of ours, intact: it imports a hook module this hs_dataset no longer has. Revert takes it out.
        return PatchStatus(
            path,
            PatchState.MODIFIED,
            f"patched by an older hs_dataset (patch v{version}, whose hook "
            f"module has moved; this is v{PATCH_VERSION}): run `hs-dataset patch revert`, then patch again",
            recorded,
            KNOWN_ORIGINALS.get(recorded),
        )
    if version != PATCH_VERSION:
        return PatchStatus(
            path,
            PatchState.UNRECOGNISED,
            f"patched by hs_dataset patch v{version}, this is v{PATCH_VERSION}: revert it with the hs_dataset version that applied it",
            recorded,
        )
    known = KNOWN_ORIGINALS.get(recorded)
    if _sha256(original.encode("utf-8")) != recorded:
        return PatchStatus(
            path,
            PatchState.MODIFIED,
            "the file was modified after patching (removing the patch does not give back the original)",
            recorded,
            known,
        )
    try:
        expected = patch_text(original)
    except LegacyPatchError as exc:
        return PatchStatus(path, PatchState.MODIFIED, f"the patched original is not recognised: {exc}", recorded, known)
    if expected != text:
        return PatchStatus(
            path,
            PatchState.MODIFIED,
            "the inserted patch lines were edited after patching; revert restores the original exactly",
            recorded,
            known,
        )
    report = recognise(original).report
    return PatchStatus(path, PatchState.PATCHED, _tested_note(recorded, "patched"), recorded, known, report)


def _tested_note(sha: str, what: str) -> str:
    version = KNOWN_ORIGINALS.get(sha)
    if version:
        return f"{what}; original is deepseek_v2.py of sglang {version} (tested)"
    return f"{what}; original matches no tested sglang release (structure recognised, untested)"


def read_source(path: Path) -> str:
    """The file's text; :class:`LegacyPatchError` if it cannot be read or is not UTF-8."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise LegacyPatchError(f"cannot read {path}: {exc}") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LegacyPatchError(f"{path} is not UTF-8 text: {exc}") from exc


def check(path: str | os.PathLike) -> PatchStatus:
    """State of the file at `path` (see PatchState)."""
    return check_text(read_source(Path(path)), str(path))


# --------------------------------------------------------------------------- write


def backup_path(path: str | os.PathLike, original_sha256: str) -> Path:
    """Backup of the original next to it; not a .py file, so SGLang never imports it."""
    path = Path(path)
    return path.with_name(f"{path.name}.hs_dataset-orig-{original_sha256[:16]}")


def _atomic_write(path: Path, data: bytes) -> None:
    """Write via a temp file in the same directory, fsync, rename, fsync the directory."""
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _drop_bytecode(path: Path) -> None:
    """Remove cached .pyc of the file: mtime+size checks can miss a same-second rewrite."""
    for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        try:
            pyc.unlink()
        except OSError:
            pass


def _write_verified(path: Path, text: str) -> None:
    data = text.encode("utf-8")
    _atomic_write(path, data)
    if _sha256(path.read_bytes()) != _sha256(data):
        raise LegacyPatchError(f"{path} does not read back what was written; check the disk")
    _drop_bytecode(path)


def apply(path: str | os.PathLike) -> PatchStatus:
    """Patch the file in place; a second call is a no-op. Returns the new status."""
    path = Path(path)
    status = check(path)
    if status.state is PatchState.PATCHED:
        return status
    if status.state is not PatchState.UNPATCHED:
        advice = "run `hs-dataset patch revert` first" if status.state is PatchState.MODIFIED else ""
        raise LegacyPatchError(f"refusing to patch {path}: {status.reason}. {advice}".strip())
    text = read_source(path)
    patched = patch_text(text)  # compiles it
    backup = backup_path(path, status.original_sha256)
    if not (backup.exists() and _sha256(backup.read_bytes()) == status.original_sha256):
        _atomic_write(backup, text.encode("utf-8"))
    _write_verified(path, patched)
    return check(path)


def revert(path: str | os.PathLike, force: bool = False) -> PatchStatus:
    """Restore the original byte for byte; with `force`, from the backup even if edited since."""
    path = Path(path)
    status = check(path)
    if status.state is PatchState.UNPATCHED:
        return status
    if status.state is PatchState.UNRECOGNISED:
        raise LegacyPatchError(f"refusing to revert {path}: {status.reason}")
    sha = status.original_sha256
    backup = backup_path(path, sha)
    original, _, _ = _strip(read_source(path))
    if _sha256(original.encode("utf-8")) != sha:
        has_backup = backup.exists() and _sha256(backup.read_bytes()) == sha
        if not (force and has_backup):
            where = (
                f"the original is in {backup} (sha256 verified)"
                if has_backup
                else (f"no valid backup at {backup}: reinstall sglang to get the original back")
            )
            raise LegacyPatchError(
                f"refusing to revert {path}: it was modified after patching, so removing the patch "
                f"would not give back the original (sha256 {sha[:16]}...); {where}"
                + ("; re-run with --force to restore it and lose the later edits" if has_backup else "")
            )
        original = backup.read_bytes().decode("utf-8")
    _write_verified(path, original)
    if backup.exists():
        backup.unlink()
    return check(path)

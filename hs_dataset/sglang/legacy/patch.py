"""Source patch that adds hidden-state capture to SGLang <= 0.5.5 (DeepseekV2/V3).

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

This file must only use the standard library: it is run in the SGLang server's
environment, and may be copied there alone and run as a script.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import enum
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Sequence

__all__ = [
    "PATCH_VERSION",
    "MARKER",
    "KNOWN_ORIGINALS",
    "LegacyPatchError",
    "PatchState",
    "PatchStatus",
    "check",
    "check_text",
    "patch_text",
    "apply",
    "revert",
    "backup_path",
    "locate_deepseek_v2",
    "sglang_version",
    "add_arguments",
    "run",
    "main",
]

PATCH_VERSION = 1
MARKER = f"# hs_dataset-patch v{PATCH_VERSION}"
_BEGIN = f"# >>> hs_dataset-patch v{PATCH_VERSION} original-sha256="
_END = f"# <<< hs_dataset-patch v{PATCH_VERSION}"
_ANY_MARK = "hs_dataset-patch"
_BEGIN_RE = re.compile(r"^# >>> hs_dataset-patch v(\d+) original-sha256=([0-9a-f]{64})\b")

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

# Module-level helper inserted before `class DeepseekV2Model`.  It is server code:
# standard library only, imports the capture hook lazily, and does nothing (imports
# nothing) unless HS_CAPTURE_STAGING_DIR is set.
_HELPER = '''\
_HS_DATASET_STATE = None


def _hs_dataset_configure():
    """Read the capture settings once; (None, ()) when capture is off."""
    import importlib
    import os

    if not os.environ.get("HS_CAPTURE_STAGING_DIR"):
        return None, ()
    try:
        hook = importlib.import_module("hs_dataset.sglang.legacy.hook")
    except ImportError as exc:
        raise RuntimeError(
            "hs_dataset: HS_CAPTURE_STAGING_DIR is set (hidden-state capture requested) but "
            "hs_dataset.sglang.legacy.hook cannot be imported in the SGLang server's "
            "Python (%r). Install hs_dataset into the server environment, or unset "
            "HS_CAPTURE_STAGING_DIR to serve without capture." % (exc,)
        ) from exc
    if not callable(getattr(hook, "on_forward", None)):
        raise RuntimeError("hs_dataset: %s has no on_forward(); update hs_dataset" % hook.__name__)
    raw = os.environ.get("HS_CAPTURE_LAYER_IDS", "")
    try:
        layer_ids = tuple(sorted(int(x) for x in raw.split(",") if x.strip()))
    except ValueError:
        layer_ids = ()
    if not layer_ids or layer_ids[0] < 0 or len(set(layer_ids)) != len(layer_ids):
        raise RuntimeError(
            "hs_dataset: HS_CAPTURE_LAYER_IDS=%r must list distinct non-negative HF "
            "hidden_states indexes, comma-separated, e.g. 2,30,58" % (raw,)
        )
    return hook, layer_ids


def _hs_dataset_begin(forward_batch):
    """Layer ids to capture in this forward pass; () when capture is off or unwanted."""
    global _HS_DATASET_STATE
    if _HS_DATASET_STATE is None:
        _HS_DATASET_STATE = _hs_dataset_configure()
    hook, layer_ids = _HS_DATASET_STATE
    if hook is None:
        return ()
    wants = getattr(hook, "wants", None)
    if wants is not None:
        return layer_ids if wants(forward_batch) else ()
    return layer_ids if forward_batch.forward_mode.name == "EXTEND" else ()


def _hs_dataset_emit(forward_batch, layer_ids, captured, hidden_states, residual):
    """Hand the captured aux states and the pre-norm final state to the hook."""
    missing = [i for i in layer_ids if i not in captured]
    if missing:
        raise RuntimeError(
            "hs_dataset: layers %s were not captured in this forward pass (captured %s). "
            "HS_CAPTURE_LAYER_IDS must be below the number of decoder layers (the final "
            "state is passed separately); two-batch overlap and pipeline parallelism run "
            "layers outside the patched loop: drop --enable-two-batch-overlap, use "
            "--pp-size 1." % (missing, sorted(captured))
        )
    prenorm_final = hidden_states.clone() if residual is None else hidden_states + residual
    aux_states = [captured[i] for i in layer_ids]
    _HS_DATASET_STATE[0].on_forward(forward_batch, aux_states, prenorm_final, list(layer_ids))


'''

# The three statements inserted into DeepseekV2Model.forward.  A fresh tensor is
# captured every time: at layer 0 `hidden_states` (residual is None) becomes the
# residual that the fused add-RMSNorm of layer 0 updates in place, so it must be
# cloned; for i > 0 the sum is already a new tensor.
_STMT_BEGIN = "_hs_ids, _hs_aux = _hs_dataset_begin(forward_batch), {}"
_STMT_CAPTURE = (
    "if {i} in _hs_ids: _hs_aux[{i}] = "
    "hidden_states.clone() if residual is None else hidden_states + residual"
)
_STMT_EMIT = "if _hs_ids: _hs_dataset_emit(forward_batch, _hs_ids, _hs_aux, hidden_states, residual)"


try:
    from hs_dataset.errors import HsDatasetError
except ImportError:  # copied alone into the server environment: no hs_dataset to derive from

    class HsDatasetError(Exception):  # type: ignore[no-redef]
        """Stand-in for hs_dataset.errors.HsDatasetError when this file runs without hs_dataset."""


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
    original_sha256: Optional[str] = None
    known_version: Optional[str] = None  # SGLang release the original matches, if any
    anchors: dict[str, int] = field(default_factory=dict)  # anchor -> line in the original

    @property
    def recognised(self) -> bool:
        return self.state in (PatchState.UNPATCHED, PatchState.PATCHED)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["state"] = self.state.value
        return data


class _Unrecognised(Exception):
    """Internal: the source does not have the shape the patch expects."""


# --------------------------------------------------------------------------- anchors


@dataclass
class _Anchors:
    """Where to insert, as 0-based line indexes into the original text."""

    helper_line: int  # `class DeepseekV2Model` (or its first decorator)
    begin_line: int  # the decoder-layer `for` loop
    capture_line: int  # `hidden_states, residual = layer(...)` inside the loop
    emit_line: int  # statement holding the final `self.norm(...)` call(s)
    loop_var: str
    report: dict[str, int]  # human-facing 1-based line numbers


def _one(nodes: list, what: str) -> ast.AST:
    """Exactly one match, or a reason naming what was missing/ambiguous."""
    if not nodes:
        raise _Unrecognised(f"{what} not found")
    if len(nodes) > 1:
        lines = ", ".join(str(n.lineno) for n in nodes)
        raise _Unrecognised(f"{what} is ambiguous ({len(nodes)} matches, lines {lines})")
    return nodes[0]


def _is_self_attr(node: ast.AST, attr: str) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == attr
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _is_layer_item(node: ast.AST, loop_var: str) -> bool:
    """`self.layers[<loop_var>]`."""
    return (
        isinstance(node, ast.Subscript)
        and _is_self_attr(node.value, "layers")
        and isinstance(node.slice, ast.Name)
        and node.slice.id == loop_var
    )


def _names(nodes: list) -> list[str]:
    """Identifiers of a tuple's elements or a call's arguments ("?" for anything else)."""
    return [n.id if isinstance(n, ast.Name) else "?" for n in nodes]


def _layer_calls(loop: ast.For) -> list[ast.Assign]:
    """`hidden_states, residual = <decoder layer>(...)` statements inside the loop."""
    if not isinstance(loop.target, ast.Name):
        return []
    var = loop.target.id
    layer_names = {
        a.targets[0].id
        for a in ast.walk(loop)
        if isinstance(a, ast.Assign)
        and len(a.targets) == 1
        and isinstance(a.targets[0], ast.Name)
        and _is_layer_item(a.value, var)
    }
    found = []
    for node in ast.walk(loop):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        func = node.value.func
        is_layer = _is_layer_item(func, var) or (isinstance(func, ast.Name) and func.id in layer_names)
        target = node.targets[0]
        if is_layer and isinstance(target, ast.Tuple) and _names(target.elts) == ["hidden_states", "residual"]:
            found.append(node)
    return found


def _contains(stmt: ast.AST, target: ast.AST) -> bool:
    return any(n is target for n in ast.walk(stmt))


def _child_blocks(stmt: ast.stmt) -> Iterator[list]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return
    for name in ("body", "orelse", "finalbody"):
        block = getattr(stmt, name, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            yield block
    for handler in getattr(stmt, "handlers", []) or []:
        yield handler.body
    for case in getattr(stmt, "cases", []) or []:
        yield case.body


def _innermost_stmt(block: list, targets: list) -> Optional[ast.stmt]:
    """The deepest statement that contains every target, searching down from `block`."""
    for stmt in block:
        if all(_contains(stmt, t) for t in targets):
            for child in _child_blocks(stmt):
                inner = _innermost_stmt(child, targets)
                if inner is not None:
                    return inner
            return stmt
    return None


def _starts_line(lines: list[str], node: ast.stmt) -> int:
    """0-based line of `node`, which must be the first thing on it (not `a; b`, `if x: b`)."""
    line = lines[node.lineno - 1]
    if len(line) - len(line.lstrip(" \t")) != node.col_offset:
        raise _Unrecognised(f"anchor statement at line {node.lineno} does not start its line")
    return node.lineno - 1


def _find_anchors(tree: ast.Module, lines: list[str]) -> _Anchors:
    """Locate every insertion point, or raise _Unrecognised naming what is missing."""
    cls = _one(
        [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DeepseekV2Model"],
        "module-level `class DeepseekV2Model`",
    )
    fwd = _one(
        [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "forward"],
        "method `DeepseekV2Model.forward`",
    )
    if "forward_batch" not in [a.arg for a in fwd.args.args + fwd.args.kwonlyargs]:
        raise _Unrecognised("`DeepseekV2Model.forward` has no `forward_batch` parameter")

    loops = [n for n in ast.walk(fwd) if isinstance(n, ast.For) and _layer_calls(n)]
    loop = _one(
        loops,
        "decoder-layer loop (`for i in ...:` containing `hidden_states, residual = "
        "self.layers[i](...)` or `layer = self.layers[i]; hidden_states, residual = layer(...)`) "
        "in DeepseekV2Model.forward",
    )
    if loop not in fwd.body:
        raise _Unrecognised(f"the decoder-layer loop (line {loop.lineno}) is not at the top level of forward")
    call = _one(_layer_calls(loop), "decoder-layer call in the loop")

    norms = [
        n for n in ast.walk(fwd)
        if isinstance(n, ast.Call) and _is_self_attr(n.func, "norm") and n.lineno > loop.end_lineno
    ]
    if not norms:
        raise _Unrecognised("final norm call `self.norm(hidden_states, ...)` after the layer loop not found")
    if not any(_names(c.args)[:2] == ["hidden_states", "residual"] for c in norms):
        raise _Unrecognised("final norm call `self.norm(hidden_states, residual)` not found")
    norm_stmt = _innermost_stmt(fwd.body, norms)
    if norm_stmt is None or norm_stmt.lineno <= loop.end_lineno:
        raise _Unrecognised("the final norm call(s) are not after the decoder-layer loop")

    if not isinstance(fwd.body[-1], ast.Return) or fwd.body[-1].lineno <= norm_stmt.end_lineno:
        raise _Unrecognised("final `return` of DeepseekV2Model.forward after the norm not found")

    helper = min([cls.lineno] + [d.lineno for d in cls.decorator_list])
    return _Anchors(
        helper_line=helper - 1,
        begin_line=_starts_line(lines, loop),
        capture_line=_starts_line(lines, call),
        emit_line=_starts_line(lines, norm_stmt),
        loop_var=loop.target.id,
        report={
            "class DeepseekV2Model": cls.lineno,
            "forward": fwd.lineno,
            "layer loop": loop.lineno,
            "layer call": call.lineno,
            "final norm": min(n.lineno for n in norms),
            "return": fwd.body[-1].lineno,
        },
    )


# --------------------------------------------------------------------------- text


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _split_lines(text: str) -> list[str]:
    """Lines with their endings.

    Only "\n" ends a line here, as for Python's tokenizer once bare "\r" is
    refused (str.splitlines would also split on form feeds and the like and put
    the ast line numbers out of step).
    """
    return re.findall(r"[^\n]*\n|[^\n]+\Z", text)


def _newline(lines: list[str]) -> str:
    return "\r\n" if lines and lines[0].endswith("\r\n") else "\n"


def _recognise(text: str) -> _Anchors:
    """Anchors of an unpatched source, or _Unrecognised with the reason."""
    if re.search(r"\r(?!\n)", text):
        raise _Unrecognised("the file uses bare carriage-return line endings")
    clash = re.search(r"\b(?:_hs_ids|_hs_aux|_hs_dataset_\w+|_HS_DATASET_\w+)\b", text)
    if clash:
        raise _Unrecognised(f"the name {clash.group(0)} the patch inserts is already used")
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise _Unrecognised(f"the file does not parse as Python ({exc.msg}, line {exc.lineno})") from exc
    return _find_anchors(tree, _split_lines(text))


def _render(text: str, anchors: _Anchors) -> str:
    """Original text plus the marked insertions."""
    lines = _split_lines(text)
    nl = _newline(lines)
    original_sha = _sha256(text.encode("utf-8"))

    def stmt(line_index: int, code: str) -> list[str]:
        line = lines[line_index]
        indent = line[: len(line) - len(line.lstrip(" \t"))]
        return [f"{indent}{code}  {MARKER}{nl}"]

    helper = [f"{_BEGIN}{original_sha} (added by `hs-dataset patch apply`; undo: `hs-dataset patch revert`){nl}"]
    helper += [f"{h}{nl}" if h else nl for h in _HELPER.split("\n")[:-1]]
    helper += [f"{_END}{nl}"]
    inserts = {
        anchors.helper_line: helper,
        anchors.begin_line: stmt(anchors.begin_line, _STMT_BEGIN),
        anchors.capture_line: stmt(anchors.capture_line, _STMT_CAPTURE.format(i=anchors.loop_var)),
        anchors.emit_line: stmt(anchors.emit_line, _STMT_EMIT),
    }
    if len(inserts) != 4:
        raise _Unrecognised("two anchors share a line")
    out: list[str] = []
    for index, line in enumerate(lines):
        out.extend(inserts.get(index, []))
        out.append(line)
    return "".join(out)


def patch_text(text: str) -> str:
    """Patched version of an unpatched source text; raises LegacyPatchError if unrecognised."""
    if _ANY_MARK in text:
        raise LegacyPatchError("the source already contains hs_dataset-patch markers; check it first")
    try:
        patched = _render(text, _recognise(text))
    except _Unrecognised as exc:
        raise LegacyPatchError(f"unrecognised deepseek_v2.py: {exc}. {_HOOKS_ADVICE}") from None
    compile(patched, "<patched deepseek_v2.py>", "exec")
    return patched


def _strip(text: str) -> tuple[str, str, int]:
    """Remove our marked lines: (original text, recorded sha256, patch version)."""
    kept: list[str] = []
    header: Optional[re.Match] = None
    inside = False
    for line in _split_lines(text):
        bare = line.rstrip("\r\n")
        if inside:
            if bare.startswith("# <<< hs_dataset-patch v"):
                inside = False
            continue
        match = _BEGIN_RE.match(bare)
        if match:
            if header is not None:
                raise _Unrecognised("more than one hs_dataset patch header")
            header, inside = match, True
            continue
        if re.search(r"  # hs_dataset-patch v\d+$", bare):
            continue
        if _ANY_MARK in bare:
            raise _Unrecognised(f"unexpected hs_dataset-patch marker in {bare.strip()[:80]!r}")
        kept.append(line)
    if header is None or inside:
        raise _Unrecognised("hs_dataset patch header missing or its block is not closed")
    return "".join(kept), header.group(2), int(header.group(1))


# --------------------------------------------------------------------------- check


def check_text(text: str, path: str = "<text>") -> PatchStatus:
    """Classify a source text; never raises for bad input (the reason says why)."""
    if _ANY_MARK not in text:
        sha = _sha256(text.encode("utf-8"))
        try:
            anchors = _recognise(text)
        except _Unrecognised as exc:
            return PatchStatus(path, PatchState.UNRECOGNISED, f"{exc}. {_HOOKS_ADVICE}", sha)
        return PatchStatus(
            path, PatchState.UNPATCHED, _tested_note(sha, "not patched; anchors recognised"),
            sha, KNOWN_ORIGINALS.get(sha), anchors.report,
        )
    try:
        original, recorded, version = _strip(text)
    except _Unrecognised as exc:
        return PatchStatus(path, PatchState.UNRECOGNISED, f"damaged hs_dataset patch: {exc}; restore the file "
                           "from its backup or reinstall sglang")
    if version != PATCH_VERSION:
        return PatchStatus(path, PatchState.UNRECOGNISED, f"patched by hs_dataset patch v{version}, this is "
                           f"v{PATCH_VERSION}: revert it with the hs_dataset version that applied it", recorded)
    known = KNOWN_ORIGINALS.get(recorded)
    if _sha256(original.encode("utf-8")) != recorded:
        return PatchStatus(path, PatchState.MODIFIED, "the file was modified after patching (removing the patch "
                           "does not give back the original)", recorded, known)
    try:
        expected = patch_text(original)
    except LegacyPatchError as exc:
        return PatchStatus(path, PatchState.MODIFIED, f"the patched original is not recognised: {exc}", recorded, known)
    if expected != text:
        return PatchStatus(path, PatchState.MODIFIED, "the inserted patch lines were edited after patching; "
                           "revert restores the original exactly", recorded, known)
    report = _recognise(original).report
    return PatchStatus(path, PatchState.PATCHED, _tested_note(recorded, "patched"), recorded, known, report)


def _tested_note(sha: str, what: str) -> str:
    version = KNOWN_ORIGINALS.get(sha)
    if version:
        return f"{what}; original is deepseek_v2.py of sglang {version} (tested)"
    return f"{what}; original matches no tested sglang release (structure recognised, untested)"


def _read(path: Path) -> str:
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
    return check_text(_read(Path(path)), str(path))


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
    text = _read(path)
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
    original, _, _ = _strip(_read(path))
    if _sha256(original.encode("utf-8")) != sha:
        has_backup = backup.exists() and _sha256(backup.read_bytes()) == sha
        if not (force and has_backup):
            where = f"the original is in {backup} (sha256 verified)" if has_backup else (
                f"no valid backup at {backup}: reinstall sglang to get the original back")
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


# --------------------------------------------------------------------------- locate


_FIND_SGLANG = (
    "import importlib.util, sys\n"
    "spec = importlib.util.find_spec('sglang')\n"
    "sys.stdout.write(list(spec.submodule_search_locations)[0] if spec else '')\n"
)


def locate_deepseek_v2(sglang_root: Optional[str] = None, python: Optional[str] = None) -> Path:
    """deepseek_v2.py of an sglang install, found without importing sglang.

    `sglang_root` is the sglang package directory or a directory holding it
    (site-packages); `python` is the server's interpreter when that differs.
    """
    if sglang_root:
        roots = [Path(sglang_root), Path(sglang_root) / "sglang"]
    elif python:
        proc = subprocess.run([python, "-c", _FIND_SGLANG], capture_output=True, text=True)
        if proc.returncode != 0 or not proc.stdout.strip():
            raise LegacyPatchError(f"sglang is not installed for {python} ({proc.stderr.strip()[-200:]})")
        roots = [Path(proc.stdout.strip())]
    else:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise LegacyPatchError(
                "sglang is not installed in this Python; pass --file PATH, --sglang-root DIR "
                "or --python SERVER_PYTHON"
            )
        roots = [Path(p) for p in spec.submodule_search_locations]
    for root in roots:
        candidate = root / "srt" / "models" / "deepseek_v2.py"
        if candidate.is_file():
            return candidate
    raise LegacyPatchError(f"no srt/models/deepseek_v2.py under {', '.join(map(str, roots))}")


def sglang_version(deepseek_v2: Path) -> Optional[str]:
    """Installed sglang version, read as text (dist-info, else version.py / _version.py)."""
    package = deepseek_v2.parent.parent.parent
    for metadata in sorted(package.parent.glob("sglang-*.dist-info/METADATA")):
        match = re.search(r"^Version:\s*(\S+)", metadata.read_text("utf-8", "replace"), re.M)
        if match:
            return match.group(1)
    for name in ("version.py", "_version.py"):
        try:
            text = (package / name).read_text("utf-8")
        except OSError:
            continue
        match = re.search(r"^__version__\s*(?::\s*str\s*)?=\s*['\"]([^'\"]+)", text, re.M)
        if match:
            return match.group(1)
    return None


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `hs-dataset patch` (also used when this file runs as a script)."""
    parser.add_argument("action", choices=["check", "apply", "revert"],
                        help="check: report state (exit 0 patched, 1 unpatched, 2 other); "
                             "apply: patch (idempotent); revert: restore the original")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--file", help="path of sglang/srt/models/deepseek_v2.py")
    where.add_argument("--sglang-root", help="sglang package directory (or the site-packages holding it)")
    where.add_argument("--python", help="the SGLang server's Python; its sglang is located")
    parser.add_argument("--dry-run", action="store_true", help="apply: print the diff, write nothing")
    parser.add_argument("--force", action="store_true",
                        help="revert: restore the verified backup even if the file was edited after patching")
    parser.add_argument("--json", action="store_true", help="print the status as JSON")


def _print_status(status: PatchStatus, args: argparse.Namespace, version: Optional[str]) -> None:
    if args.json:
        print(json.dumps(dict(status.to_dict(), sglang_version=version), indent=2))
        return
    print(f"{status.path}: {status.state.value}" + (f" (sglang {version})" if version else ""))
    print(f"  {status.reason}")
    if status.anchors:
        print("  anchors: " + ", ".join(f"{k} L{v}" for k, v in status.anchors.items()))


def run(args: argparse.Namespace) -> int:
    """Carry out the parsed action; refusals raise :class:`LegacyPatchError` (the caller reports them)."""
    path = Path(args.file) if args.file else locate_deepseek_v2(args.sglang_root, args.python)
    version = None if args.file else sglang_version(path)
    if args.action == "check":
        status = check(path)
        _print_status(status, args, version)
        return {PatchState.PATCHED: 0, PatchState.UNPATCHED: 1}.get(status.state, 2)
    if args.action == "apply" and args.dry_run:
        text = _read(path)
        sys.stdout.writelines(difflib.unified_diff(
            _split_lines(text), _split_lines(patch_text(text)), str(path), f"{path} (patched)"))
        return 0
    status = apply(path) if args.action == "apply" else revert(path, force=args.force)
    _print_status(status, args, version)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Script entry point (``python legacy_patch.py``), for servers without hs_dataset installed."""
    parser = argparse.ArgumentParser(
        prog="legacy_patch.py", description="Check / apply / revert the hs_dataset capture patch (SGLang <= 0.5.5)."
    )
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except (LegacyPatchError, OSError) as exc:
        print(f"legacy_patch.py: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

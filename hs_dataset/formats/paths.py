"""The one door from a name written in a dataset (or export record) to a path on disk.

A dataset directory is untrusted input: its manifest (and an export's record) names
files, and a hostile or damaged one could name ``../../.ssh/id_rsa``, an absolute
path, or a symlink that leads out of the directory. Every such name goes through
:func:`resolve_member` (or :func:`open_member`), which accepts only a plain relative
name of safe characters, refuses a symlink at any component and anything whose
real path leaves the root; files are opened with ``O_NOFOLLOW`` and must be regular
files (a FIFO would hang a reader, a device would feed it endless bytes).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import BinaryIO

from hs_dataset.errors import FormatError, UnsafePathError, UsageError

__all__ = [
    "MAX_NAME_CHARS",
    "MAX_NAME_DEPTH",
    "check_local_path",
    "check_member_name",
    "check_plain_name",
    "make_directory",
    "open_member",
    "open_regular",
    "resolve_member",
    "url_scheme",
]

MAX_NAME_CHARS = 1024  # a whole relative name
MAX_NAME_DEPTH = 8  # components ("part-00001/shard-000000.safetensors" has 2)
# One component: starts with a letter, digit or '_' (no hidden files, no '-option'), 255 chars at most.
_COMPONENT_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,254}$")
# ``s3://b/x`` and what ``Path("s3://b/x")`` makes of it (``s3:/b/x``); two letters at least, so ``C:/`` is no URL
_URL_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+):/")
URL_HINT = (
    "fsspec URLs are read by hs_dataset.open_dataset and hs-dataset verify / merge, written by hs-dataset build --out (docs/REMOTE.md)"
)
_FIX = "a dataset may only name plain files inside its own directory; restore the original manifest entry (or file)"


def url_scheme(path: object) -> str | None:
    """The scheme of a URL (``s3`` for ``s3://bucket/ds``), None for a local path.

    Also spots a URL that went through ``Path`` (which folds ``//`` into ``/``), so a URL
    never becomes a local directory named ``s3:``.
    """
    match = _URL_RE.match(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else None
    return match.group(1).lower() if match else None


def check_local_path(path: str | os.PathLike, *, what: str) -> Path:
    """``path`` as a local Path; a URL is refused in one line (it would become a directory named ``s3:``).

    A NUL byte is refused too: every system call would fail on it with a bare ValueError
    ("embedded null byte") that names neither the argument nor the path.
    """
    scheme = url_scheme(path)
    if scheme is not None:
        raise UsageError(f"{os.fspath(path)}: {what} is a {scheme}:// URL, but this takes a local directory; {URL_HINT}")
    if "\x00" in str(os.fspath(path)):
        raise UsageError(f"{str(os.fspath(path))!r:.200}: {what} holds a NUL byte, which no file name may hold; give the path without it")
    return Path(path)


def make_directory(path: Path, *, what: str) -> None:
    """Create ``path`` (and its parents) as a directory, or keep the one there; one UsageError line when it cannot be made.

    Why: ``Path.mkdir`` fails with a bare OSError (``[Errno 20] Not a directory``) that names
    no argument and says nothing of the fix. A read-only or full disk (EROFS, EACCES,
    EPERM, ENOSPC) is left to the caller, which names it in its own terms (the cache's
    ``ReadOnlyError``, the writer's ``DiskFullError``).
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        dangling = path.is_symlink() and not path.exists()
        kind = "a symbolic link that leads nowhere (dangling, or a loop)" if dangling else "a file, not a directory"
        raise UsageError(f"{path}: {what} is {kind}; give a directory (new or empty)") from None
    except NotADirectoryError:
        raise UsageError(f"{path}: {what} cannot be created: a part of its path is a file; give another directory") from None
    except OSError as exc:
        if exc.errno in _LEFT_TO_CALLER:
            raise
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"{path}: {what} cannot be created ({reason}); give a directory on a writable local file system") from None


_LEFT_TO_CALLER = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT})


def check_member_name(name: object, *, what: str, where: str) -> str:
    """Return ``name`` if it is a plain relative name (``a/b.safetensors``), else raise FormatError.

    ``what`` is the field that holds it (``shards[3].file``), ``where`` the file that
    holds the field (the manifest path), so the message says where to look.
    """
    if not isinstance(name, str):
        raise FormatError(f"{where}: {what} must be a string file name, got {type(name).__name__}; {_FIX}")
    problem = _name_problem(name)
    if problem:
        raise FormatError(f"{where}: {what} {name[:200]!r} {problem}; {_FIX}")
    return name


def check_plain_name(name: object, *, what: str, where: str) -> str:
    """Return ``name`` if it is one plain component (a ``dataset_id``: it names a directory of its own), else raise FormatError.

    Why: a reader keeps a dataset's side files under ``<cache>/meta/<dataset_id>``; an
    absolute id (``/home/x/.ssh``) or one holding ``..`` would put them anywhere.
    """
    check_member_name(name, what=what, where=where)
    if "/" in str(name):
        raise FormatError(f"{where}: {what} {str(name)[:200]!r} holds a '/'; it must be one plain name; {_FIX}")
    return str(name)


def _name_problem(name: str) -> str | None:
    if not name or len(name) > MAX_NAME_CHARS:
        return f"is empty or longer than {MAX_NAME_CHARS} characters"
    if name.startswith("/") or "\\" in name or "\x00" in name:
        return "is absolute or holds a backslash or NUL (only relative names with '/' are allowed)"
    parts = name.split("/")
    if len(parts) > MAX_NAME_DEPTH:
        return f"is nested deeper than {MAX_NAME_DEPTH} directories"
    for part in parts:
        if part in ("", ".", ".."):
            return "holds an empty, '.' or '..' component (it would leave the dataset directory)"
        if not _COMPONENT_RE.match(part):
            return f"has component {part[:80]!r} outside [A-Za-z0-9_.-] (or starting with '.' or '-')"
    return None


def resolve_member(root: str | os.PathLike, name: object, *, what: str, where: str | None = None) -> Path:
    """``root/name`` after checking the name, that no existing component is a symlink, and that it stays in ``root``.

    The path may not exist yet (a writer's destination, a missing shard: callers say
    "missing" in their own words); what exists of it must be real directories and,
    last, any non-symlink entry.
    """
    root = Path(root)
    where = where or str(root / "manifest.json")
    check_member_name(name, what=what, where=where)
    path = root
    for part in str(name).split("/"):
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            break
        except OSError as exc:
            raise UnsafePathError(f"{path}: {what} {name!r} cannot be inspected ({exc.strerror}); {_FIX}") from None
        if stat.S_ISLNK(mode):
            raise UnsafePathError(
                f"{path}: {what} {name!r} is a symbolic link ({where}); links could lead outside the dataset, so they are "
                "refused: replace the link with a copy of the file it points to"
            )
    real_root = os.path.realpath(root)
    real = os.path.realpath(root / str(name))
    if os.path.commonpath([real_root, real]) != real_root:
        raise UnsafePathError(f"{root / str(name)}: {what} {name!r} resolves to {real}, outside {real_root} ({where}); {_FIX}")
    return root / str(name)


def open_regular(path: str | os.PathLike, *, what: str) -> BinaryIO:
    """Open ``path`` for reading without following a final symlink, and only if it is a regular file.

    ``O_NONBLOCK`` keeps a FIFO from blocking the open; it does not affect reads of
    regular files. Raises FileNotFoundError when missing (callers name it).
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:  # ELOOP: the last component became a symlink after it was checked
        raise UnsafePathError(f"{path}: {what} cannot be opened safely ({exc.strerror}); {_FIX}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePathError(f"{path}: {what} is not a regular file (a directory, FIFO, socket or device); {_FIX}")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_member(root: str | os.PathLike, name: object, *, what: str, where: str | None = None) -> BinaryIO:
    """:func:`resolve_member` then :func:`open_regular`: the way to read a file a dataset names."""
    return open_regular(resolve_member(root, name, what=what, where=where), what=what)

"""The staging directory's rule: a real directory of this user's, mode 0700, never a symlink."""

from __future__ import annotations

import os
import stat

from hs_dataset.errors import HsDatasetError

__all__ = ["StagingError", "check_private_dir", "ensure_private_dir"]


class StagingError(HsDatasetError, RuntimeError):
    """The staging directory is unsafe or unusable."""


def check_private_dir(path: str) -> os.stat_result:
    """Raise :class:`StagingError` unless ``path`` is a real directory, ours, mode ``0700`` (or stricter)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise StagingError(f"staging directory {path} does not exist") from None
    if stat.S_ISLNK(st.st_mode):
        raise StagingError(f"staging directory {path} is a symlink; refusing it (use a real, private directory)")
    if not stat.S_ISDIR(st.st_mode):
        raise StagingError(f"staging path {path} exists and is not a directory")
    if st.st_uid != os.geteuid():
        raise StagingError(
            f"staging directory {path} is owned by uid {st.st_uid}, not by this user ({os.geteuid()}); "
            "use a directory of your own (or remove it so it is created afresh)"
        )
    if st.st_mode & 0o077:
        raise StagingError(
            f"staging directory {path} has mode {stat.S_IMODE(st.st_mode):04o}; it must be private (0700): "
            f"run `chmod 700 {path}` or choose another directory"
        )
    return st


def ensure_private_dir(path: str) -> str:
    """Create ``path`` with mode 0700 (parents as needed), or check an existing one. Returns the abspath."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    try:
        os.mkdir(path, 0o700)  # the umask can only remove bits: never wider than 0700
    except FileExistsError:
        pass
    check_private_dir(path)
    return path

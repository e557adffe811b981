"""Temp files whose writer proves it is still writing by a lock it holds, never by clocks.

A download in progress is a temp file (:func:`~hs_dataset.formats.atomic.temp_path_for`:
``.hs-tmp-<pid>-<random>-<final name>``) that other readers of the same file wait for.
Why not judge it by its mtime: a file's times are whatever its writer (or anyone who may
write the directory) sets; a temp naming a live pid with an mtime a day ahead blocked
every reader until the clock caught up, and a slow but live download could be taken for
a leftover. So the writer creates the temp and takes an exclusive ``flock`` on it at once
(:func:`create_held`), and holds it until the file is renamed into place or removed. A
temp is waited for only while the pid its name gives is alive *and* the file is locked:
the kernel drops the lock when the writer's process ends, however it ends, and nobody
can make a dead pid hold one. A temp that fails either test is a leftover (removed, its
file downloaded again), whatever its times say.

Shared directories: a temp is created 0o666 less the umask, so another user of the
directory can open it to test its lock. One this user cannot open (another user's, under a
umask that hides it from the group) cannot be judged: while its pid lives that is a
PermissionError for the caller to name, never taken for a leftover (removing a live
download would break its writer) nor waited on (the pid may be reused: a wait without end).
"""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path

from hs_dataset.formats.atomic import temp_writer_pid
from hs_dataset.formats.writable import open_for_writing

__all__ = ["create_held", "is_abandoned", "pid_alive"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def create_held(path: Path) -> int:
    """Create the temp ``path`` (it must not exist) and lock it: a descriptor to keep open until the file is placed or removed.

    Create and lock are two calls: the caller makes them under the lock that other
    judges of the temp take too (the cache's directory lock), so none sees the file unheld.
    """
    fd = open_for_writing(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


def is_abandoned(path: Path) -> bool:
    """Nobody writes this temp: its name gives no live pid, or no process holds its lock (or it is no regular file, or gone).

    PermissionError where the pid lives and this user may not open the file to test its lock (see the module docstring).
    """
    pid = temp_writer_pid(path.name)
    if pid is None or not pid_alive(pid):
        return True
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return True  # a link, FIFO or directory under a temp name: nobody's download
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC)
    except PermissionError:
        raise  # another user's, hidden from this one: not judged (a live download must not be removed)
    except OSError:  # gone (nothing to wait for), or swapped for a link meanwhile
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # its writer holds it
    finally:
        os.close(fd)  # also lets go of the lock this took
    return True


def pid_alive(pid: int) -> bool:
    """A process with this pid exists now (another user's too)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such process; a pid no process can have
        return False
    except PermissionError:  # another user's live process
        return True
    return True

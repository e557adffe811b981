"""The private staging directory: creation checks, atomic writes, spares, refusal markers, sweeping.

Stdlib only (runs inside SGLang scheduler processes and in the client).

Safety rules (docs/SGLANG.md, "Staging"):

* the directory is created ``0700``; an existing one is refused if it is a symlink,
  not a directory, owned by another user, or readable/writable by group/others;
* every file is created through a directory file descriptor with
  ``O_CREAT | O_EXCL | O_NOFOLLOW`` under a ``.tmp-`` name, then hard-linked to its
  final name (which fails instead of overwriting) and the temporary name unlinked, so
  a reader never sees a partial file and nothing outside the directory is touched;
* a dump is written over a spare (a dump the client has handed back into
  ``.spares/``, see ``spares.hand_back_dump``) when one is there: the pool directory
  is opened ``O_NOFOLLOW`` and used only if private and ours, a spare is claimed by a
  rename to the temporary name, opened ``O_NOFOLLOW`` and used only if it is a
  private regular file of ours with no other link, then truncated to the new size;
* a dump is copied in through a shared mapping of its file kept from the file's last
  round (:mod:`hs_dataset.server_patch.contract.mapped_files`), once the file is truncated to its size and its pages
  are allocated (``posix_fallocate``: a full tmpfs then fails the write with ENOSPC
  instead of killing the process with SIGBUS); ``os.writev`` where that cannot be done;
* :class:`~hs_dataset.server_patch.budget.StagingBudget` bounds the bytes and files
  waiting for the client (it reads :meth:`StagingDir.usage`).
"""

from __future__ import annotations

import errno
import itertools
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Sequence

from hs_dataset.server_patch.contract.dump import DUMP_SUFFIX, REFUSED_SUFFIX, TMP_PREFIX
from hs_dataset.server_patch.contract.mapped_files import FileMaps, copy_into
from hs_dataset.server_patch.contract.private_dir import StagingError, check_private_dir, ensure_private_dir
from hs_dataset.server_patch.contract.spares import SPARE_DIR, spare_size

Buffer = bytes | bytearray | memoryview
_IOV_MAX = 512  # under every platform's IOV_MAX (Linux: 1024)
_SPARE_MIN_BYTES = 1 << 16  # refusal markers and tiny dumps are cheaper to create than a spare is to find

__all__ = ["StagingDir"]

logger = logging.getLogger("hs_dataset.server_patch")


class StagingDir:
    """Atomic, no-follow, no-clobber file operations inside one private directory."""

    def __init__(self, path: str, *, create: bool = True) -> None:
        self.path = ensure_private_dir(path) if create else os.path.abspath(path)
        if not create:
            check_private_dir(self.path)
        fd = _open_private_dir(self.path)
        if fd is None:  # replaced between the check and the open
            raise StagingError(f"staging directory {self.path} changed while being opened; refusing it")
        self.fd = fd
        self._counter = itertools.count()
        self._pid = os.getpid()
        self._pool_fd: int | None = None  # .spares/, opened once a client has made it
        self._pool_lock = threading.Lock()
        self._maps = FileMaps(writable=True)  # dumps' files, mapped once per file while they go round the spare pool

    def close(self) -> None:
        with self._pool_lock:
            self._drop_pool_fd()
        self._maps.close()
        try:
            os.close(self.fd)
        except OSError:
            pass

    def _pool(self) -> int | None:
        """The spare pool's directory fd, if the pool exists and is a private directory of ours."""
        if self._pool_fd is None:
            try:
                self._pool_fd = _open_private_dir(SPARE_DIR, dir_fd=self.fd)
            except OSError:  # not made yet, or not a directory
                return None
        return self._pool_fd

    def _drop_pool_fd(self) -> None:
        fd, self._pool_fd = self._pool_fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def _tmp_name(self, final: str) -> str:
        return f"{TMP_PREFIX}{final}.{self._pid}.{next(self._counter)}"

    def write_atomic(self, name: str, data: Buffer | Sequence[Buffer]) -> bool:
        """Write ``data`` (one buffer, or buffers written back to back) to ``name``; False if it exists.

        The buffers go straight to the file (a dump: a small header, then the tensors'
        host memory), so no serialized copy of a multi-GB dump is ever built: into a
        spare through the mapping kept from its last round here, else with ``os.writev``
        (a new file's pages are new either way, and ``write`` allocates them cheaper than
        faults do). ``name`` is never overwritten.
        """
        if "/" in name or name.startswith(".") or name in ("", "..") or "\0" in name:
            raise StagingError(f"refusing unsafe staging file name {name!r}")
        buffers = [data] if isinstance(data, (bytes, bytearray, memoryview)) else list(data)
        size = sum(memoryview(b).nbytes for b in buffers)
        fd, tmp, spare = self._claim_spare(name, size) if size >= _SPARE_MIN_BYTES else (None, "", None)
        if fd is None:
            tmp = self._tmp_name(name)
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600, dir_fd=self.fd)
        try:
            try:
                if not (spare is not None and _size_spare(fd, size, spare) and self._write_mapped(fd, buffers, size, spare)):
                    _write_buffers(fd, buffers)
            finally:
                os.close(fd)
            try:
                os.link(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd, follow_symlinks=False)
            except FileExistsError:
                return False
            except OSError as exc:  # filesystems without hard links: rename without clobbering check
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                    raise
                try:
                    os.stat(name, dir_fd=self.fd, follow_symlinks=False)
                    return False
                except FileNotFoundError:
                    os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
                    tmp = None
            return True
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp, dir_fd=self.fd)
                except FileNotFoundError:
                    pass

    def _write_mapped(self, fd: int, buffers: Sequence[Buffer], size: int, spare: os.stat_result) -> bool:
        """Copy ``buffers`` into a sized spare through its kept mapping; False where the caller must write instead."""
        with self._maps.mapped(fd, size, kept_only=True, file_stat=spare) as address:
            if address is None:  # a spare this process has not written before: mapped now, for its next round
                return False
            offset = 0
            for buffer in buffers:
                view = memoryview(buffer).cast("B")
                copy_into(address, offset, view)
                offset += view.nbytes
        os.utime(fd)  # stores through a kept mapping need not touch the times: the sweeper ages files by mtime
        return True

    def _claim_spare(self, name: str, size: int) -> tuple[int | None, str, os.stat_result | None]:
        """Take a spare for a ``size``-byte file on its way to ``name``.

        Returns (open fd, temp name, its ``fstat``), or (None, "", None) where there is none.

        The spare closest in size wins (the fewest pages to allocate or free). A claimed
        file that is not a plain private file of ours with one link is deleted unused.
        """
        while self._take_spare(tmp := self._tmp_name(name), size):
            fd = -1
            try:
                fd = os.open(tmp, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0), dir_fd=self.fd)
                st = os.fstat(fd)
                if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid == os.geteuid() and not st.st_mode & 0o077:
                    return fd, tmp, st  # sized by the write (_size_spare): from this stat, as claimed
            except OSError:
                pass
            if fd >= 0:
                os.close(fd)
            try:
                os.unlink(tmp, dir_fd=self.fd)
            except OSError:  # a directory planted in the pool: the sweeper ignores it, nothing writes to it
                pass
        return None, "", None

    def _take_spare(self, tmp: str, size: int) -> bool:
        """Rename the pool's spare closest to ``size`` bytes to ``tmp``; False if there is none."""
        with self._pool_lock:  # the sweeper reopens the pool fd: never use it while it may close
            pool = self._pool()
            if pool is None:
                return False
            try:
                with os.scandir(pool) as it:
                    spares = [(e.name, spare_size(e)) for e in it if e.is_file(follow_symlinks=False)]
            except OSError:
                return False
            for spare, _ in sorted(spares, key=lambda s: abs(s[1] - size)):
                try:
                    os.rename(spare, tmp, src_dir_fd=pool, dst_dir_fd=self.fd)
                    return True
                except OSError:  # claimed by another writer (or swept) meanwhile, or not renamable
                    continue
            return False

    def write_refusal(self, rid: str, reason: str) -> bool:
        body = json.dumps({"rid": rid, "reason": reason}).encode()
        return self.write_atomic(rid + REFUSED_SUFFIX, body)

    def exists(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            return True
        except FileNotFoundError:
            return False

    def usage(self) -> tuple[int, int]:
        """(bytes, files) of dumps and temporaries currently in the directory."""
        total = files = 0
        with os.scandir(self.fd) as it:
            for entry in it:
                name = entry.name
                if name.endswith(DUMP_SUFFIX) or name.startswith(TMP_PREFIX):
                    try:
                        total += entry.stat(follow_symlinks=False).st_size
                    except FileNotFoundError:
                        continue
                    files += 1
        return total, files

    def sweep(self, max_age_s: float, now: float | None = None, *, spare_max_age_s: float | None = None) -> int:
        """Delete dumps, refusal markers and temporaries older than ``max_age_s``; return how many.

        Spares no writer claimed for ``spare_max_age_s`` (by ctime: the hand-back rename
        sets it) are deleted too, quietly: that is the pool giving memory back when
        capture goes idle, not lost work.
        """
        now = time.time() if now is None else now
        removed = 0
        with os.scandir(self.fd) as it:
            entries = list(it)
        self._sweep_pool(now, max_age_s if spare_max_age_s is None else spare_max_age_s)
        for entry in entries:
            name = entry.name
            if not (name.endswith((DUMP_SUFFIX, REFUSED_SUFFIX)) or name.startswith(TMP_PREFIX)):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode) or now - st.st_mtime < max_age_s:
                    continue
                os.unlink(name, dir_fd=self.fd)
                removed += 1
            except FileNotFoundError:
                continue
        self._maps.prune()  # mappings of files deleted since (here, by the client, or swept spares): their memory goes back now
        if removed:
            logger.warning("hs_dataset capture: swept %d unclaimed staging files older than %.0f s", removed, max_age_s)
        return removed

    def _sweep_pool(self, now: float, max_age_s: float) -> None:
        """Delete spares unclaimed for ``max_age_s`` (by ctime: the hand-back rename sets it)."""
        with self._pool_lock:
            self._drop_pool_fd()  # reopened: a pool directory replaced since is checked afresh
            pool = self._pool()
            if pool is None:
                return
            try:
                with os.scandir(pool) as it:
                    entries = list(it)
            except OSError:
                return
            for entry in entries:
                try:
                    if now - entry.stat(follow_symlinks=False).st_ctime >= max_age_s:
                        os.unlink(entry.name, dir_fd=pool)
                except OSError:  # gone, or a directory planted there: not ours to remove
                    continue


def _open_private_dir(path: str, dir_fd: int | None = None) -> int | None:
    """An fd on directory ``path`` (never through a symlink) if it is ours and private (0700 or stricter), else None."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0), dir_fd=dir_fd)
    st = os.fstat(fd)
    if st.st_uid == os.geteuid() and not st.st_mode & 0o077:
        return fd
    os.close(fd)
    return None


def _size_spare(fd: int, size: int, st: os.stat_result) -> bool:
    """Make a claimed spare (``st``: its ``fstat`` when claimed) ``size`` bytes long; True if every page is
    allocated, so a mapped copy is safe.

    A copy through a mapping into a page the file system has no room for raises SIGBUS;
    ``posix_fallocate`` turns that into ENOSPC here. False on a file system without it
    (``write`` then reports a full disk safely).
    """
    if st.st_size != size:
        os.ftruncate(fd, size)
    if st.st_size < size or st.st_blocks * 512 < size:  # a hole: the spare grew (a spare once written whole has none)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise
            return False
    return True


def _write_buffers(fd: int, buffers: Sequence[Buffer]) -> None:
    """Write every buffer, in order, with as few system calls as the kernel allows.

    ``os.writev`` may write less than asked (a signal, or Linux's ~2 GiB per-call cap),
    so the remainder is resubmitted from where it stopped; at most :data:`_IOV_MAX`
    buffers go in one call.
    """
    views = [memoryview(b).cast("B") for b in buffers]
    views = [v for v in views if v.nbytes]
    if not hasattr(os, "writev"):  # pragma: no cover - Windows
        for view in views:
            while view:
                view = view[os.write(fd, view) :]
        return
    i = 0
    while i < len(views):
        batch = views[i : i + _IOV_MAX]
        written = os.writev(fd, batch)
        if written <= 0:
            raise OSError(f"writev wrote nothing ({written}) with {sum(v.nbytes for v in batch)} bytes to go")
        for view in batch:  # skip the buffers written whole; keep the rest of a partial one
            if written >= view.nbytes:
                written -= view.nbytes
                i += 1
            else:
                views[i] = view[written:]
                break

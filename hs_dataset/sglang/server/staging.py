"""The private staging directory: creation checks, atomic writes, the byte/file budget, sweeping.

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
  round (:mod:`.mapped_files`), once the file is truncated to its size and its pages
  are allocated (``posix_fallocate``: a full tmpfs then fails the write with ENOSPC
  instead of killing the process with SIGBUS); ``os.writev`` where that cannot be done;
* a :class:`StagingBudget` bounds the bytes and files waiting for the client.
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
from typing import Callable, Sequence, Union

from hs_dataset.wire.mapped_files import FileMaps, copy_into
from hs_dataset.wire.dump import DUMP_SUFFIX, REFUSED_SUFFIX, TMP_PREFIX
from hs_dataset.wire.private_dir import StagingError, check_private_dir, ensure_private_dir
from hs_dataset.wire.spares import SPARE_DIR, spare_size

Buffer = Union[bytes, bytearray, memoryview]
_IOV_MAX = 512  # under every platform's IOV_MAX (Linux: 1024)
_SPARE_MIN_BYTES = 1 << 16  # refusal markers and tiny dumps are cheaper to create than a spare is to find

__all__ = [
    "StagingError",
    "ensure_private_dir",
    "check_private_dir",
    "StagingDir",
    "StagingBudget",
]

logger = logging.getLogger("hs_dataset.sglang.server")


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
            if not (name.endswith(DUMP_SUFFIX) or name.endswith(REFUSED_SUFFIX) or name.startswith(TMP_PREFIX)):
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


class StagingBudget:
    """Bounded staging: bytes and files waiting for the client, plus writes in flight.

    ``reserve`` is called on the forward thread before a copy; it waits at most
    ``timeout`` for the client to drain the directory and returns False if the budget is
    still exceeded (the caller then writes a refusal marker -- the forward pass is never
    blocked longer than that). Usage on disk is re-read from the directory (other
    processes, e.g. other DP ranks, may share it and the client deletes files).

    Who re-reads it: with :meth:`start_meter`, a background thread, every
    ``rescan_interval_s``, and at once (then at most every ``poll_s``) while a
    reservation waits for room, so the forward thread never scans. A scan stats every
    file waiting in the directory, each stat handing the GIL back (400 files, measured
    once on a 2-core machine: 0.7 ms quiet, 0.4 s with one other thread wanting the
    GIL) -- time the forward pass would wait. Without the meter (unit tests, tools)
    ``reserve`` scans itself, as it always did.
    """

    def __init__(
        self,
        max_bytes: int,
        max_files: int,
        usage: Callable[[], tuple[int, int]],
        *,
        rescan_interval_s: float = 0.25,
        poll_s: float = 0.02,
    ) -> None:
        self.max_bytes = int(max_bytes)
        self.max_files = int(max_files)
        self._usage = usage
        self._rescan_interval_s = rescan_interval_s
        self._poll_s = poll_s
        self._cond = threading.Condition()
        self._inflight_bytes = 0
        self._inflight_files = 0
        self._disk_bytes = 0
        self._disk_files = 0
        self._scanned_at = float("-inf")
        self._meter: threading.Thread | None = None
        self._meter_stop = False
        self._rescan_wanted = False  # a reservation waits for room: the meter scans now, then every poll_s
        self._scan_lock = threading.Lock()
        self._committed_in_scan: tuple[int, int] | None = None  # during a meter scan: what was committed since it began

    # ------------------------------------------------------------------ the meter
    def start_meter(self, name_thread: Callable[[str], None] = lambda _name: None) -> None:
        """Re-read the directory's usage from a background thread from now on (see the class docstring)."""
        with self._cond:
            if self._meter is not None:
                return
            self._meter_stop = False
            self._meter = threading.Thread(target=self._meter_loop, args=(name_thread,), name="hs-staging-meter", daemon=True)
        self.refresh()  # the first figures before any reservation relies on them
        self._meter.start()

    def stop_meter(self, timeout: float = 5.0) -> None:
        """Stop the meter (before the directory it reads is closed); ``reserve`` scans itself again."""
        with self._cond:
            meter, self._meter_stop = self._meter, True
            self._cond.notify_all()
        if meter is not None:
            meter.join(timeout)
        with self._cond:
            self._meter = None

    def _meter_loop(self, name_thread: Callable[[str], None]) -> None:
        name_thread("hs-staging-meter")
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._meter_stop or self._rescan_wanted, timeout=self._rescan_interval_s)
                # at most one scan per poll_s, however often a waiting reservation asks
                self._cond.wait_for(lambda: self._meter_stop, timeout=max(0.0, self._scanned_at + self._poll_s - time.monotonic()))
                if self._meter_stop:
                    return
            try:
                self.refresh()
            except OSError:  # the directory is gone or closing: the figures stay as they were
                pass

    def refresh(self) -> None:
        """Re-read the usage on disk without holding the lock, so reservations and commits go on meanwhile.

        A file committed while the scan ran is added to what the scan found: the scan may
        have missed it. If it also saw it, the file counts twice until the next scan --
        an over-count, which only makes the budget stricter for a moment.
        """
        with self._scan_lock:  # one scan at a time: each owns the count of commits made during it
            with self._cond:
                self._committed_in_scan, self._rescan_wanted = (0, 0), False
            try:
                disk_bytes, disk_files = self._usage()
            except BaseException:
                with self._cond:
                    self._committed_in_scan = None
                raise
            with self._cond:
                late_bytes, late_files = self._committed_in_scan
                self._committed_in_scan = None
                self._disk_bytes, self._disk_files = disk_bytes + late_bytes, disk_files + late_files
                self._scanned_at = time.monotonic()
                self._cond.notify_all()

    # ------------------------------------------------------------------ reservations
    def _rescan_locked(self) -> None:
        self._disk_bytes, self._disk_files = self._usage()
        self._scanned_at = time.monotonic()

    def _fits_locked(self, nbytes: int, nfiles: int) -> bool:
        return (
            self._disk_bytes + self._inflight_bytes + nbytes <= self.max_bytes
            and self._disk_files + self._inflight_files + nfiles <= self.max_files
        )

    def reserve(self, nbytes: int, timeout: float, *, nfiles: int = 1) -> bool:
        if nbytes > self.max_bytes or nfiles > self.max_files:
            return False
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            metered = self._meter is not None
            if not metered and time.monotonic() - self._scanned_at > self._rescan_interval_s:
                self._rescan_locked()
            while True:
                if self._fits_locked(nbytes, nfiles):
                    self._inflight_bytes += nbytes
                    self._inflight_files += nfiles
                    return True
                if not metered:
                    self._rescan_locked()
                    if self._fits_locked(nbytes, nfiles):
                        continue
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if metered:
                    self._rescan_wanted = True
                    self._cond.notify_all()
                self._cond.wait(min(self._poll_s, left))

    def committed(self, nbytes: int, nfiles: int = 1) -> None:
        """The reserved bytes are now a file on disk (counted there until the next rescan)."""
        with self._cond:
            self._inflight_bytes -= nbytes
            self._inflight_files -= nfiles
            self._disk_bytes += nbytes
            self._disk_files += nfiles
            if self._committed_in_scan is not None:
                late_bytes, late_files = self._committed_in_scan
                self._committed_in_scan = (late_bytes + nbytes, late_files + nfiles)
            self._cond.notify_all()

    def release(self, nbytes: int, nfiles: int = 1) -> None:
        """Give back a reservation that produced no file."""
        with self._cond:
            self._inflight_bytes -= nbytes
            self._inflight_files -= nfiles
            self._cond.notify_all()

    def snapshot(self) -> dict:
        with self._cond:
            return {
                "inflight_bytes": self._inflight_bytes,
                "inflight_files": self._inflight_files,
                "disk_bytes": self._disk_bytes,
                "disk_files": self._disk_files,
            }

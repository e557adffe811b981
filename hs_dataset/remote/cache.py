"""The bounded local cache of verified shards: what a remote dataset is read from.

Files are named by their recorded hash (``blake3-<hex>.safetensors``), so one shard is
cached once whichever dataset or process asks, and a name is only ever published after
its bytes were hashed on download (:mod:`.transfer`). Downloads are not fsynced (the disk's
write speed would cap them): a file older than the machine's last boot, which a crash
could have cut, is hashed again before it is used. Every file in the directory counts
toward ``max_bytes``, downloads in flight too: room for a download is reserved (its temp
file is allocated at full size) under the directory's lock, evicting the least recently
used shards first. A shard a reader has open holds a shared ``flock`` on its file and is
never evicted (in any process on the node), so the bound holds for bytes really on disk.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from hs_dataset.errors import UsageError
from hs_dataset.formats.atomic import TEMP_PREFIX, is_temp_name, remove_quietly, temp_path_for
from hs_dataset.formats.writable import open_for_writing
from hs_dataset.formats.hashing import file_digests
from hs_dataset.formats.manifest import ShardRecord
from hs_dataset.formats.paths import open_regular
from hs_dataset.remote.location import RemoteLocation
from hs_dataset.remote.transfer import Expected, download_file

__all__ = ["ShardCache", "disk_usage"]

_SUFFIX = ".safetensors"
_LOCK_NAME = ".lock"
_WAIT_S = 0.02  # poll interval while another thread or process downloads the same shard


def disk_usage(directory: Path) -> int:
    """Bytes the files under ``directory`` hold on disk (allocated blocks, or size where larger)."""
    total = 0
    for base, _dirs, files in os.walk(directory):
        for name in files:
            try:
                st = os.lstat(os.path.join(base, name))
            except FileNotFoundError:
                continue
            total += max(st.st_size, st.st_blocks * 512)
    return total


class ShardCache:
    """Shards of remote datasets on local disk, at most ``max_bytes`` of them."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int) -> None:
        self.directory = Path(directory)
        self.max_bytes = int(max_bytes)
        self.directory.mkdir(parents=True, exist_ok=True)

    def path_for(self, record: ShardRecord) -> Path:
        return self.directory / f"{record.hash_algorithm}-{record.digest}{_SUFFIX}"

    def fetch(self, loc: RemoteLocation, record: ShardRecord) -> Path:
        """The cached copy of ``record``'s shard under ``loc``, downloaded (and hash-checked) when absent."""
        path = self.path_for(record)
        if record.bytes > self.max_bytes:
            raise UsageError(
                f"{loc.url}/{record.file}: {record.bytes} bytes, larger than the cache bound {self.max_bytes} "
                f"({self.directory}); raise max_cache_bytes (HS_DATASET_CACHE_BYTES) to a few shards at least"
            )
        while not self._hit(path, record):
            temp = self._reserve(record.bytes, loc.url, path)
            if temp is None:  # another thread or process is downloading it: wait for its copy
                time.sleep(_WAIT_S)
                continue
            download_file(loc, record.file, path, Expected(record.bytes, record.hash_algorithm, record.digest), temp=temp, durable=False)
        return path

    def open_pinned(self, path: Path) -> int:
        """A file descriptor holding a shared lock on a cached shard: it is not evicted until the fd is closed."""
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        fcntl.flock(fd, fcntl.LOCK_SH)
        return fd

    @staticmethod
    def _hit(path: Path, record: ShardRecord) -> bool:
        """Present and whole. Downloads are not fsynced, so a file older than the last boot is hashed again first."""
        try:
            st = os.stat(path)
            if st.st_size != record.bytes:
                return False
            if st.st_mtime < _boot_time() and not _same_hash(path, record):
                remove_quietly(path)
                return False
            os.utime(path)  # most recently used (and known whole in this boot)
            return True
        except FileNotFoundError:
            return False

    def _reserve(self, size: int, url: str, path: Path) -> Path | None:
        """A temp file of ``size`` allocated bytes for ``path``, after evicting least recently used shards to make room.

        None when a live download of ``path`` is under way (its temp file names it).
        """
        lock = _lock(self.directory)
        try:
            if self._remove_dead_temps(path.name):
                return None
            used = disk_usage(self.directory)
            for candidate in self._eviction_order():
                if used + size <= self.max_bytes:
                    break
                used -= self._evict(candidate)
            if used + size > self.max_bytes:
                raise UsageError(
                    f"{self.directory}: the cache bound {self.max_bytes} bytes cannot hold {url}'s next shard ({size} bytes) beside "
                    f"the {used} bytes of shards in use or downloading; raise max_cache_bytes (HS_DATASET_CACHE_BYTES) or read "
                    "with fewer prefetch_shards / processes"
                )
            temp = temp_path_for(path)
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
            try:
                _allocate(fd, size)
            finally:
                os.close(fd)
            return temp
        finally:
            os.close(lock)

    def _eviction_order(self) -> list[Path]:
        """Complete cached shards, least recently used first."""
        entries = []
        for entry in os.scandir(self.directory):
            if entry.name.endswith(_SUFFIX) and not is_temp_name(entry.name) and entry.is_file(follow_symlinks=False):
                entries.append((entry.stat(follow_symlinks=False).st_mtime_ns, Path(entry.path)))
        return [path for _mtime, path in sorted(entries)]

    @staticmethod
    def _evict(path: Path) -> int:
        """Delete ``path`` unless a reader holds it; returns the bytes it held.

        Always unlinked, never overwritten in place: tensors a reader handed out may
        still map the file after its pin is gone, and an unlinked file stays valid for them.
        """
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return 0
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0  # in use by a reader
            st = os.fstat(fd)
            remove_quietly(path)
            return max(st.st_size, st.st_blocks * 512)
        finally:
            os.close(fd)

    def _remove_dead_temps(self, wanted: str) -> bool:
        """Remove the downloads of processes that died (they count toward the bound); True if ``wanted`` is downloading."""
        busy = False
        for name in os.listdir(self.directory):
            if not name.startswith(TEMP_PREFIX):
                continue
            pid = name[len(TEMP_PREFIX):].partition("-")[0]
            if pid.isdigit() and not _alive(int(pid)):
                remove_quietly(self.directory / name)
            elif name.endswith("-" + wanted):
                busy = True
        return busy


def _lock(directory: Path) -> int:
    """The cache's ``.lock``, exclusively, waiting for another process's reservation (held for milliseconds)."""
    fd = open_for_writing(directory / _LOCK_NAME, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _boot_time() -> float:
    """When the machine booted (0 where unknown: every cached file is then trusted as written)."""
    try:
        with open("/proc/stat") as f:
            return float(next(line.split()[1] for line in f if line.startswith("btime ")))
    except (OSError, StopIteration, ValueError, IndexError):
        return 0.0


def _same_hash(path: Path, record: ShardRecord) -> bool:
    with open_regular(path, what="cached shard") as f:
        return file_digests(f, (record.hash_algorithm,))[record.hash_algorithm] == record.digest


def _allocate(fd: int, size: int) -> None:
    """Reserve ``size`` bytes on disk now, so the bound counts a download before its bytes arrive."""
    if size <= 0:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except (AttributeError, OSError):
        os.ftruncate(fd, size)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

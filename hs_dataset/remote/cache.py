"""The bounded local cache of verified shards: what a remote dataset is read from.

A cache owns only what it wrote. Its directory is claimed once, empty, by writing the
cache's index (``.hs_dataset-cache.json``, its marker too); a directory holding anything
else (a dataset, a user's ``model.safetensors``, an older cache) is refused, nothing in
it touched. The index lists every shard the cache downloaded, checked and placed: its
name (``blake3-<hex>.safetensors``, the recorded hash, so one shard is cached once
whichever dataset or process asks), the inode, size and mtime it was placed with,
read-only, and when it was last used. A process serves a cached file only after it
checked the file's bytes itself (hashed them on download, or the first time it opens a
shard another process placed) and while the file is unchanged since, by a signature a
writer cannot put back (``remote/verified.py``: the ctime moves on any edit); one that
fails (flipped after download, edited with its size and mtime put back, planted under a
cache name, cut by a crash: downloads are not fsynced) is hashed again, and removed
(then downloaded again) only if the cache wrote it. Eviction takes only index entries.

Every file in the directory counts toward ``max_bytes``, downloads in flight too: room
for a download is reserved (its temp file is allocated at full size) under the
directory's lock, evicting the least recently used shards first (use = the time the index
notes on a hit, never a time set on the shard: that would change its ctime and cost every
other process a hash). A shard a reader has open holds a shared ``flock`` on its file
and is never evicted (in any process on the node), so the bound holds for bytes really on disk.
A download in flight holds an exclusive ``flock`` on its temp file: others wait for it
only while that lock is held (``formats/held_temps.py``), never judging it by its times.
Every write here goes through ``remote/cache_dir.py``: a read-only or full cache
directory is one named line, not a raw OSError. That module also sets the modes of what
the cache creates (the umask's, for a cache a group shares): a user who may not write
another's lock or index still takes the lock (read-only descriptor) and replaces the
index by rename; a file this user may not remove (a sticky directory) is left in place,
counted toward the bound.
"""

from __future__ import annotations

import fcntl
import functools
import json
import logging
import os
import re
import stat
import time
from pathlib import Path
from typing import Any

from hs_dataset import strict_json
from hs_dataset.errors import ForeignDatasetError, IntegrityError, ReadOnlyError, UsageError
from hs_dataset.formats.atomic import TEMP_PREFIX, is_temp_name, remove_quietly, temp_path_for, write_all
from hs_dataset.formats.dirlock import open_lock_file
from hs_dataset.formats.hashing import file_digests
from hs_dataset.formats.held_temps import create_held, is_abandoned
from hs_dataset.formats.manifest import MANIFEST_NAME, ShardRecord
from hs_dataset.formats.paths import check_local_path, make_directory, open_regular
from hs_dataset.formats.writable import open_for_writing
from hs_dataset.remote import verified
from hs_dataset.remote.cache_dir import cache_writes, make_subdirs, without_write_bits
from hs_dataset.remote.location import RemoteLocation
from hs_dataset.remote.transfer import Expected, receive_file

__all__ = ["INDEX_NAME", "META_DIR", "ShardCache", "cache_name", "disk_usage"]

INDEX_NAME = ".hs_dataset-cache.json"
META_DIR = "meta"  # the small files datasets name besides shards (remote/dataset.py), one directory per dataset id
_LOCK_NAME = ".lock"
_FORMAT = "hs_dataset-cache"
_MAX_INDEX_BYTES = 64 * 1024 * 1024
_NAME_RE = re.compile(r"^(blake3|sha256)-[0-9a-f]{64}\.safetensors$")
_WAIT_S = 0.02  # poll interval while another thread or process downloads the same shard
_BLOCK = 4096  # a file's allocation unit here
_ENTRY_BYTES = 200  # one more index entry, at most
_USE_NOTE_NS = 10**10  # a hit notes its use in the index at most every 10 s per shard: eviction order, not a rewrite per open

_log = logging.getLogger("hs_dataset.remote")
_unremovable: set[Path] = set()  # files another user left that this process may not remove, already warned about
Entry = dict[str, int]  # ino, size, mtime_ns, boot; used (ns, optional: older indexes lack it)


def cache_name(record: ShardRecord) -> str:
    """The name a shard is cached under: its recorded hash (one copy whichever dataset or process asks)."""
    return f"{record.hash_algorithm}-{record.digest}.safetensors"


def disk_usage(directory: Path) -> int:
    """Bytes the files under ``directory`` hold on disk (allocated blocks, or size where larger)."""
    return sum(_size_on_disk(Path(base, name)) for base, _dirs, files in os.walk(directory) for name in files)


def _size_on_disk(path: Path) -> int:
    """Allocated blocks, or the size where larger; 0 for a file gone."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    return max(st.st_size, st.st_blocks * 512)


class ShardCache:
    """Shards of remote datasets on local disk, at most ``max_bytes`` of them, in a directory the cache owns."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int) -> None:
        self.directory = check_local_path(directory, what="cache_dir")
        self.max_bytes = int(max_bytes)
        if self.directory.exists() and not self.directory.is_dir():
            raise UsageError(f"{self.directory}: cache_dir is a file, not a directory; give a directory (or HS_DATASET_CACHE_DIR)")
        with cache_writes(self.directory):
            make_directory(self.directory, what="cache_dir")
            if not os.path.lexists(self.directory / INDEX_NAME):
                self._refuse_foreign()  # before the lock file is created: a refused directory is left as it was
            lock = _lock(self.directory)
            try:
                self._claim()
            finally:
                os.close(lock)

    def path_for(self, record: ShardRecord) -> Path:
        return self.directory / cache_name(record)

    def fetch(self, loc: RemoteLocation, record: ShardRecord) -> Path:
        """The cached copy of ``record``'s shard under ``loc``, downloaded (and hash-checked) when absent."""
        path = self.path_for(record)
        if record.bytes > self.max_bytes:
            raise UsageError(
                f"{loc.url}/{record.file}: {record.bytes} bytes, larger than the cache bound {self.max_bytes} "
                f"({self.directory}); raise max_cache_bytes (HS_DATASET_CACHE_BYTES) to a few shards at least"
            )
        with cache_writes(self.directory):
            while not self._hit(path, record):
                reserved = self._reserve(record.bytes, loc.url, path)
                if reserved is None:  # another thread or process is downloading it: wait for its copy
                    time.sleep(_WAIT_S)
                    continue
                temp, held = reserved
                try:
                    receive_file(loc, record.file, temp, Expected(record.bytes, record.hash_algorithm, record.digest), durable=False)
                    self._place(temp, path)
                finally:
                    os.close(held)  # the download's lock: held until its file has its name (or is gone)
        return path

    def fetch_side_file(self, loc: RemoteLocation, name: str, dest: Path, expected: Expected) -> None:
        """A small file a dataset names besides its shards (the norm weight) into ``dest`` inside the cache, checked before it is placed.

        Its room is reserved as a shard's is (it counts toward the bound); it is not evicted.
        """
        with cache_writes(self.directory):
            while (reserved := self._reserve(expected.size, loc.url, dest)) is None:
                time.sleep(_WAIT_S)
            temp, held = reserved
            try:
                receive_file(loc, name, temp, expected, durable=False)
                make_subdirs(self.directory, dest.parent)
                os.replace(temp, dest)
            finally:
                os.close(held)

    def open_pinned(self, path: Path) -> int:
        """A file descriptor holding a shared lock on a cached shard: it is not evicted until the fd is closed.

        The file opened must be the one this process checked (:meth:`fetch` did): one
        replaced or edited since is FileNotFoundError, so the caller fetches (checks) it again.
        """
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        fcntl.flock(fd, fcntl.LOCK_SH)
        if not verified.is_verified(path, os.fstat(fd)):
            os.close(fd)
            raise FileNotFoundError(f"{path}: changed since this process checked it; fetch it again")
        return fd

    # ------------------------------------------------------------------ ownership
    def _claim(self) -> None:
        """Write the index into an empty directory; refuse one holding anything the cache did not write."""
        index = self.directory / INDEX_NAME
        if os.path.lexists(index):
            if not stat.S_ISREG(os.lstat(index).st_mode):
                raise ForeignDatasetError(
                    f"{index}: not a regular file (a link?); this is no hs_dataset cache: give cache_dir an empty or new directory"
                )
            return
        self._refuse_foreign()
        self._write_index({})

    def _refuse_foreign(self) -> None:
        """A directory without the cache's index may hold only a lock and temp files (an interrupted claim)."""
        foreign = sorted(n for n in os.listdir(self.directory) if n != _LOCK_NAME and not is_temp_name(n))
        if MANIFEST_NAME in foreign:
            raise ForeignDatasetError(
                f"{self.directory}: cache_dir holds a dataset ({MANIFEST_NAME}); the cache would evict its files: "
                "give cache_dir an empty or new directory (a local dataset is read in place, with no cache)"
            )
        if foreign and all(_NAME_RE.match(n) or n == META_DIR for n in foreign):
            raise ForeignDatasetError(
                f"{self.directory}: a cache written by an older hs_dataset (no {INDEX_NAME}); nothing in it was changed: "
                "delete the directory (its shards are downloaded again) or give another cache_dir"
            )
        if foreign:
            raise ForeignDatasetError(
                f"{self.directory}: cache_dir holds files the cache did not write ({len(foreign)}, e.g. {foreign[:3]}); "
                "nothing in it was changed: give cache_dir an empty or new directory"
            )

    def _read_index(self) -> dict[str, Entry]:
        """The index's entries; a damaged index counts as empty (files are then hashed again before use)."""
        path = self.directory / INDEX_NAME
        try:
            with open_regular(path, what="cache index") as f:
                data = f.read(_MAX_INDEX_BYTES + 1)
            raw = strict_json.loads(data.decode("utf-8")) if len(data) <= _MAX_INDEX_BYTES else None
        except FileNotFoundError:
            raise ForeignDatasetError(f"{path}: the cache's index was removed while the cache was in use; reopen the dataset") from None
        except (OSError, ValueError, RecursionError, IntegrityError):
            raw = None
        files = raw.get("files") if isinstance(raw, dict) and raw.get("format") == _FORMAT else None
        if not isinstance(files, dict):
            _log.warning("%s: damaged; cached shards are hashed again before use", path)
            return {}
        return {name: entry for name, entry in files.items() if _NAME_RE.match(str(name)) and _valid_entry(entry)}

    def _write_index(self, files: dict[str, Entry]) -> None:
        """Rewrite the index in place, under the exclusive lock (readers take it shared).

        In place, not through a temp copy: the copy would count toward the bound too. A
        crash mid-write leaves a damaged index, which counts as empty: cached shards are
        then hashed again before use, none is lost or served unchecked.
        """
        data = json.dumps({"format": _FORMAT, "version": 1, "files": files}).encode()
        path = self.directory / INDEX_NAME
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = open_for_writing(path, flags, 0o666)
        except ReadOnlyError:
            if not os.path.isfile(path):
                raise
            _replace_index(path, data)  # another user's index (umask 022): replaced, which needs only the directory
            return
        try:
            write_all(fd, memoryview(data))  # from offset 0: the fd is new
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ serving
    def _hit(self, path: Path, record: ShardRecord) -> bool:
        """Present, the cache's own and whole: checked by this process and unchanged since, else hashed again (then listed, or removed)."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        if stat.S_ISREG(st.st_mode) and verified.is_verified(path, st) and self._note_use(path, st):
            return True
        return self._recheck(path, record, st)

    def _note_use(self, path: Path, st: os.stat_result) -> bool:
        """Whether the index lists ``path`` as the file ``st`` describes (the cache's own); if so its use is noted for eviction.

        Noted at most every ``_USE_NOTE_NS`` per shard: a rewrite of the index under the
        exclusive lock, not on every open of a shard read often.
        """
        lock = _lock(self.directory, shared=True)
        try:
            entry = self._read_index().get(path.name)
        finally:
            os.close(lock)
        if entry is None or not _matches(entry, st):
            return False
        if time.time_ns() - entry.get("used", 0) < _USE_NOTE_NS:
            return True
        lock = _lock(self.directory)
        try:
            files = self._read_index()
            entry = files.get(path.name)
            if entry is None or not _matches(entry, st):
                return False
            entry["used"] = time.time_ns()
            self._write_index(files)
        finally:
            os.close(lock)
        return True

    def _recheck(self, path: Path, record: ShardRecord, st: os.stat_result) -> bool:
        """A file under a cache name that its entry does not vouch for: hash it, then list it, remove it (if the cache's) or refuse it."""
        whole = stat.S_ISREG(st.st_mode) and st.st_size == record.bytes and _same_hash(path, record)
        changed = False
        lock = _lock(self.directory)
        try:
            files = self._read_index()
            entry = files.pop(path.name, None)
            try:
                now = os.lstat(path)
            except FileNotFoundError:
                self._write_index(files)
                return False
            if verified.signature(now) != verified.signature(st):
                changed = True  # changed while it was hashed: look again
            elif whole:
                if now.st_mode & 0o222 and now.st_uid == os.geteuid() and now.st_nlink == 1:
                    # moves the ctime: the signature remembered is the one after. Another user's file is left as it is (the
                    # hash vouches), and so is a file with other names (a user's file hard-linked in): its mode is that
                    # file's too, and the cache changes nothing of a user's
                    without_write_bits(path, now)
                    now = os.lstat(path)
                files[path.name] = _entry(now)
                self._write_index(files)
                verified.remember(path, now)
                return True
            elif entry is not None and entry["ino"] == st.st_ino and stat.S_ISREG(st.st_mode):
                _log.warning("%s: cached shard changed since it was downloaded (or cut by a crash); downloading it again", path)
                verified.forget(path)
                remove_quietly(path)
                self._write_index(files)
                return False
            elif entry is not None:
                self._write_index(files)  # the entry's file is gone: another took its name
        finally:
            os.close(lock)
        if changed:
            return self._hit(path, record)
        raise IntegrityError(
            f"{path}: a file the cache did not write lies under a cache name and does not hold the bytes that name records; "
            "the cache never serves or deletes files it did not write: remove it"
        )

    def _place(self, temp: Path, path: Path) -> None:
        """Give the checked download its name, read-only, and list it, under the lock (the index and the name change together)."""
        lock = _lock(self.directory)
        try:
            files = self._read_index()
            if os.path.lexists(path):  # another process placed it meanwhile (or a file was planted: _hit decides)
                remove_quietly(temp)
                return
            without_write_bits(temp, os.lstat(temp))
            os.replace(temp, path)
            placed = os.lstat(path)
            files[path.name] = _entry(placed)
            self._write_index(files)
            verified.remember(path, placed)  # its bytes were hashed on the way in, by this process
        finally:
            os.close(lock)

    # ------------------------------------------------------------------ the bound
    def _reserve(self, size: int, url: str, path: Path) -> tuple[Path, int] | None:
        """A temp file of ``size`` allocated bytes for ``path``, after evicting least recently used shards to make room.

        Returns it with the descriptor holding its lock (close it once the file is placed
        or removed); None when a live download of ``path`` is under way (its temp file names it).
        """
        lock = _lock(self.directory)
        try:
            if self._remove_dead_temps(path.name):
                return None
            used = disk_usage(self.directory) + self._index_headroom()
            size = -(-size // _BLOCK) * _BLOCK  # what the file will hold on disk: whole blocks
            files = self._read_index()
            listed = len(files)
            for name in _least_recent_first(files):
                if used + size <= self.max_bytes:
                    break
                used -= self._evict(self.directory / name, files)
            if len(files) != listed:
                self._write_index(files)
            if used + size > self.max_bytes:
                raise self._bound_error(url, size, used)
            temp = self.directory / temp_path_for(path).name  # in the cache root, where dead downloads are found
            fd = create_held(temp)  # under the directory lock: no judge of temps sees it unheld
            try:
                _allocate(fd, size)
            except BaseException:
                os.close(fd)
                remove_quietly(temp)
                raise
            return temp, fd
        finally:
            os.close(lock)

    def _bound_error(self, url: str, size: int, used: int) -> UsageError:
        """The bound cannot hold the next download: what holds the room, the other users' files this user may not remove among it."""
        stuck = sum(_size_on_disk(path) for path in _unremovable if path.parent == self.directory)
        theirs = (
            f", {stuck} of them another user's files this user may not remove (a sticky directory: that user's reads evict them)"
            if stuck
            else ""
        )
        return UsageError(
            f"{self.directory}: the cache bound {self.max_bytes} bytes cannot hold {url}'s next shard ({size} bytes) beside "
            f"the {used} bytes of shards in use or downloading (and of files the cache did not write{theirs}); raise max_cache_bytes "
            "(HS_DATASET_CACHE_BYTES), read with fewer prefetch_shards / processes, or remove files you put there"
        )

    def _index_headroom(self) -> int:
        """Room the index's next entry may take (a block where it crosses one): the index counts toward the bound too."""
        try:
            st = os.lstat(self.directory / INDEX_NAME)
        except FileNotFoundError:
            return _BLOCK
        return _BLOCK if st.st_blocks * 512 - st.st_size < _ENTRY_BYTES else 0

    @staticmethod
    def _evict(path: Path, files: dict[str, Entry]) -> int:
        """Delete ``path`` if it is still the file the cache placed and no reader holds it; returns the bytes freed.

        Always unlinked, never overwritten in place: tensors a reader handed out may
        still map the file after its pin is gone, and an unlinked file stays valid for them.
        """
        entry = files.get(path.name)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            files.pop(path.name, None)
            return 0
        except OSError:  # a link (ELOOP): not the cache's
            files.pop(path.name, None)
            return 0
        try:
            st = os.fstat(fd)
            if entry is None or not stat.S_ISREG(st.st_mode) or st.st_ino != entry["ino"]:
                files.pop(path.name, None)  # another file took the name: not the cache's to delete
                return 0
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0  # in use by a reader
            if not _removed(path):
                return 0  # another user's, in a sticky directory: listed still, counted toward the bound
            files.pop(path.name, None)
            return max(st.st_size, st.st_blocks * 512)
        finally:
            os.close(fd)

    def _remove_dead_temps(self, wanted: str) -> bool:
        """Remove abandoned downloads (no live writer holds them: they count toward the bound); True if ``wanted`` is downloading."""
        busy = False
        for name in os.listdir(self.directory):
            if not name.startswith(TEMP_PREFIX):
                continue
            if is_abandoned(self.directory / name):
                _removed(self.directory / name)  # one this user may not remove stays, counted toward the bound
            elif name.endswith("-" + wanted):
                busy = True
        return busy


def _entry(st: os.stat_result) -> Entry:
    """What the index records of a placed file: inode, size, mtime, the boot it was checked in, and its use (now)."""
    return {"ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "boot": _boot_time(), "used": time.time_ns()}


def _matches(entry: Entry, st: os.stat_result) -> bool:
    """The index's entry describes this file (the cache's own: it may evict it). Ownership only: bytes are checked per process."""
    return (entry["ino"], entry["size"], entry["mtime_ns"], entry["boot"]) == (st.st_ino, st.st_size, st.st_mtime_ns, _boot_time())


def _valid_entry(entry: Any) -> bool:
    keys = {"ino", "size", "mtime_ns", "boot"}
    return isinstance(entry, dict) and keys <= set(entry) <= keys | {"used"} and all(type(v) is int for v in entry.values())


def _least_recent_first(files: dict[str, Entry]) -> list[str]:
    """The index's shards, least recently used (the use a hit notes in the index) first."""
    return sorted(files, key=lambda name: files[name].get("used", 0))


def _replace_index(path: Path, data: bytes) -> None:
    """Write the index as a new file renamed over the old: for a user who may write the directory but not the index.

    Called under the exclusive lock, so no reservation measures the copy meanwhile; a
    crash leaves a temp nobody holds, removed as a dead download.
    """
    temp = temp_path_for(path)
    fd = open_for_writing(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        write_all(fd, memoryview(data))
    finally:
        os.close(fd)
    try:
        os.replace(temp, path)
    except BaseException:
        remove_quietly(temp)
        raise


def _lock(directory: Path, *, shared: bool = False) -> int:
    """The cache's ``.lock`` (shared: to read the index), waiting for another process's reservation (held for milliseconds)."""
    fd = open_lock_file(directory / _LOCK_NAME)
    fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
    return fd


@functools.lru_cache(maxsize=1)
def _boot_time() -> int:
    """When the machine booted (0 where unknown: every entry then stays trusted across boots)."""
    try:
        with open("/proc/stat") as f:
            return int(next(line.split()[1] for line in f if line.startswith("btime ")))
    except (OSError, StopIteration, ValueError, IndexError):
        return 0


def _removed(path: Path) -> bool:
    """Unlink ``path``; False where this user may not (another user's file in a sticky directory), logged once per file."""
    try:
        remove_quietly(path)
    except PermissionError:
        if path not in _unremovable:
            _unremovable.add(path)
            _log.warning("%s: another user's file the cache cannot remove (sticky directory); it stays, counted toward the bound", path)
        return False
    return True


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

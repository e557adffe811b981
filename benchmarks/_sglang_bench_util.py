"""Helpers the SGLang benchmarks share: the server env, their work dirs, a free port, and cleanup."""

from __future__ import annotations

import os
import signal
import socket
import sys
import tempfile
from pathlib import Path

__all__ = [
    "SERVER_PYTHON",
    "finish_run",
    "free_port",
    "group_pids",
    "remove_files",
    "server_python_missing",
    "server_shm_files",
    "start_run",
    "stop_and_clean",
]

SERVER_PYTHON = Path(__file__).resolve().parents[1] / ".sglang-venv" / "bin" / "python"


def server_python_missing() -> bool:
    """True (after saying so on stderr) when the CPU SGLang env is not there."""
    if SERVER_PYTHON.exists():
        return False
    print(f"{SERVER_PYTHON} not found: run `make sglang-env` first", file=sys.stderr)
    return True


def start_run(name: str) -> tuple[Path, Path]:
    """A benchmark's work dirs (a temp dir, and one under /dev/shm for staging when writable).

    Also turns SIGTERM into SystemExit, so the benchmark's ``finally`` (:func:`finish_run`)
    still stops its server.
    """
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = Path(tempfile.mkdtemp(prefix=f"hs-bench-{name}-"))
    shm = Path(tempfile.mkdtemp(prefix=f"hs-bench-{name}-", dir="/dev/shm")) if os.access("/dev/shm", os.W_OK) else tmp
    return tmp, shm


# SGLang leaves its load-snapshot slot file (/dev/shm/sglang_loads_*.shm) and multiprocessing
# semaphores (/dev/shm/sem.mp-*) behind when it is stopped with signals; collect the ones
# this benchmark's server has open while it runs, and delete them after it stopped.
_LEAKY_SHM = ("sglang_loads_", "sem.mp-")


def group_pids(pgid: int) -> list[str]:
    """The pids (as /proc entry names) of every live process in process group ``pgid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[2]) == pgid:  # field 5 (pgrp) after the comm
                    pids.append(entry)
        except (OSError, IndexError, ValueError):
            continue
    return pids


def server_shm_files(pgid: int) -> set[str]:
    found: set[str] = set()
    for entry in group_pids(pgid):
        try:
            paths = []
            with open(f"/proc/{entry}/maps") as f:
                paths += [line.split(None, 5)[5].strip() for line in f if line.count(" ") >= 5 and "/dev/shm/" in line]
            for fd in os.listdir(f"/proc/{entry}/fd"):
                try:
                    paths.append(os.readlink(f"/proc/{entry}/fd/{fd}"))
                except OSError:
                    continue
        except (OSError, IndexError, ValueError):
            continue
        for p in paths:
            p = p.removesuffix(" (deleted)")  # a mapped name may be unlinked and still come back (semaphores)
            if p.startswith("/dev/shm/") and os.path.basename(p).startswith(_LEAKY_SHM):
                found.add(p)
    return found


def remove_files(paths: set[str]) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_and_clean(server, shm_seen: set[str]) -> None:
    """Stop a benchmark's server and delete the /dev/shm files it left behind."""
    if server is None:
        return
    leaked = server_shm_files(server.proc.pid) | shm_seen
    server.stop(timeout=10)
    remove_files(leaked)


def finish_run(server, shm_seen: set[str], tmp: str, shm: str, closers=()) -> None:
    """A benchmark's ``finally``: close its clients, stop the server, remove its files."""
    import shutil

    for closer in closers:
        closer.close()
    stop_and_clean(server, shm_seen)
    shutil.rmtree(tmp, ignore_errors=True)
    if shm != tmp:
        shutil.rmtree(shm, ignore_errors=True)

"""What the capture hooks saw, written beside the dumps, so a client that waits in vain can say why in seconds.

Every server process that writes dumps (attention-TP rank 0 of each DP group) keeps
``{staging}/.hs-status-<writer>.json`` up to date: the facts it read from the SGLang it
runs in (does ``ForwardBatch`` carry request ids, is a prefill CUDA graph on, which
mechanism), and counters of what reached its hooks (prefill passes, requests seen,
requests skipped as foreign and the last few of their ids, dumps written, refusals,
hook errors), with ``counted_at``, the wall-clock time the counters were read. The file
is rewritten whole (temp name, then rename) off the forward thread; readers cap what
they read. A client whose dump does not come compares two
readings (:mod:`hs_dataset.capture.sglang.diagnose`): no file at all, no prefill pass
since the request, or the request among the skipped ones each name a cause and its fix.

Stdlib only: both sides import it.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from typing import Any

__all__ = [
    "STATUS_FORMAT", "STATUS_VERSION", "STATUS_PREFIX", "STATUS_SUFFIX", "MAX_STATUS_BYTES", "RECENT_IDS",
    "STATUS_INTERVAL_S", "STATUS_HEARTBEAT_S", "status_name", "is_status_name", "write_status", "read_statuses",
]

STATUS_FORMAT = "hs_dataset.status"
STATUS_VERSION = 1
STATUS_PREFIX = ".hs-status-"  # a dot name: dump readers and listings skip it; the sweeper leaves it alone
STATUS_SUFFIX = ".json"
MAX_STATUS_BYTES = 64 * 1024  # a status file is a few hundred bytes; anything larger is not ours
RECENT_IDS = 8  # request ids kept per list (skipped as foreign, dumped, refused)
STATUS_INTERVAL_S = 0.25  # how often a changed status is rewritten
STATUS_HEARTBEAT_S = 1.0  # ... and an unchanged one, so a reader always has counters newer than its request
_WRITER_RE = re.compile(r"\A[a-z0-9-]{1,40}\Z")


def status_name(writer: str) -> str:
    """The file name of one writer's status (``writer``: e.g. ``dp0``)."""
    if not _WRITER_RE.match(writer):
        raise ValueError(f"status writer name must be 1-40 of [a-z0-9-], got {writer!r}")
    return f"{STATUS_PREFIX}{writer}{STATUS_SUFFIX}"


def is_status_name(name: str) -> bool:
    return name.startswith(STATUS_PREFIX) and name.endswith(STATUS_SUFFIX)


def write_status(staging_dir: str, writer: str, payload: dict[str, Any]) -> None:
    """Replace the writer's status file atomically (a reader sees the old or the new one, never half)."""
    body = json.dumps({"format": STATUS_FORMAT, "version": STATUS_VERSION, "writer": writer, "updated": time.time(), **payload},
                      separators=(",", ":"), default=str).encode()
    final = os.path.join(staging_dir, status_name(writer))
    tmp = os.path.join(staging_dir, f".tmp-status-{uuid.uuid4().hex}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.write(fd, body)
    finally:
        os.close(fd)
    os.replace(tmp, final)


def read_statuses(staging_dir: str) -> list[dict[str, Any]]:
    """Every well-formed status file in ``staging_dir`` (none: ``[]``); unreadable or foreign ones are skipped."""
    found = []
    try:
        names = [n for n in os.listdir(staging_dir) if is_status_name(n)]
    except OSError:
        return []
    for name in sorted(names):
        try:
            fd = os.open(os.path.join(staging_dir, name), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as f:
                raw = f.read(MAX_STATUS_BYTES + 1)
            status = json.loads(raw) if len(raw) <= MAX_STATUS_BYTES else None
        except (OSError, ValueError):
            continue
        if isinstance(status, dict) and status.get("format") == STATUS_FORMAT and status.get("version") == STATUS_VERSION:
            found.append(status)
    return found

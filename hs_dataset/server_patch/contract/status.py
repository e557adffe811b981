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

from hs_dataset.server_patch.contract.staged_file import read_staged

__all__ = [
    "MAX_STATUS_BYTES",
    "RECENT_IDS",
    "STATUS_FIELDS",
    "STATUS_FORMAT",
    "STATUS_HEARTBEAT_S",
    "STATUS_INTERVAL_S",
    "STATUS_PREFIX",
    "STATUS_SUFFIX",
    "STATUS_VERSION",
    "is_status_name",
    "read_statuses",
    "status_name",
    "status_problem",
    "write_status",
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
    body = json.dumps(
        {"format": STATUS_FORMAT, "version": STATUS_VERSION, "writer": writer, "updated": time.time(), **payload},
        separators=(",", ":"),
        default=str,
    ).encode()
    final = os.path.join(staging_dir, status_name(writer))
    tmp = os.path.join(staging_dir, f".tmp-status-{uuid.uuid4().hex}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.write(fd, body)
    finally:
        os.close(fd)
    os.replace(tmp, final)


# The fields a reader uses, and the JSON types each must have when present (a file of ours always has them right;
# anything else is not ours, and is skipped with the reason). Unknown fields are left alone (newer writers).
_NUMBER, _TEXT, _TEXT_OR_NULL = (int, float), (str,), (str, type(None))
STATUS_FIELDS: dict[str, tuple[type, ...]] = {
    "writer": _TEXT,
    "updated": _NUMBER,
    "counted_at": _NUMBER,
    "started": _NUMBER,
    "pid": (int,),
    "counts": (dict,),
    "facts": (dict,),
    "recent_foreign": (list,),
    "recent_dumps": (list,),
    "recent_refused": (list,),
    "rid_prefix": _TEXT,
    "mechanism": _TEXT,
    "sglang_version": _TEXT,
    "last_error": _TEXT_OR_NULL,
    "last_unusable": _TEXT_OR_NULL,
    "hf_aux_layer_ids": (list,),
    "content_keys": (bool,),
}
_MAX_LIST = 64  # ids a list may hold (a writer keeps RECENT_IDS)


def status_problem(status: object) -> str | None:
    """Why a parsed status file is not one of ours (a wrong format or a field of the wrong type), or None."""
    if not isinstance(status, dict):
        return f"not a JSON object but a {type(status).__name__}"
    if status.get("format") != STATUS_FORMAT or status.get("version") != STATUS_VERSION:
        return f"format {str(status.get('format'))[:40]!r} v{str(status.get('version'))[:8]}, not {STATUS_FORMAT} v{STATUS_VERSION}"
    for name, types in STATUS_FIELDS.items():
        if name not in status:
            continue
        value = status[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return f"field {name} is a {type(value).__name__}, expected {' or '.join(t.__name__ for t in types if t is not type(None))}"
        if isinstance(value, float) and value != value:
            return f"field {name} is NaN"
    return _member_problem(status)


def _member_problem(status: dict[str, Any]) -> str | None:
    counts = status.get("counts") or {}
    bad = next((k for k, v in counts.items() if not isinstance(v, int) or isinstance(v, bool) or v < 0), None)
    if bad is not None:
        return f"counts.{str(bad)[:40]} is {str(counts[bad])[:40]!r}, expected a count"
    for name in ("recent_foreign", "recent_dumps", "recent_refused"):
        ids = status.get(name) or []
        if len(ids) > _MAX_LIST or not all(isinstance(i, str) for i in ids):
            return f"field {name} must be a list of at most {_MAX_LIST} request ids"
    layers = status.get("hf_aux_layer_ids") or []
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
        return "field hf_aux_layer_ids must be a list of integers"
    return None


def read_statuses(staging_dir: str, problems: list[str] | None = None) -> list[dict[str, Any]]:
    """Every status file of ours in ``staging_dir`` (none: ``[]``).

    Each is read as the untrusted file it is (:mod:`.staged_file`: a regular file, never
    a FIFO or a link, at most :data:`MAX_STATUS_BYTES`) and checked field by field
    (:func:`status_problem`). Anything else is skipped; ``problems``, when given,
    receives one line per skipped file naming it and why.
    """
    found = []
    try:
        names = [n for n in os.listdir(staging_dir) if is_status_name(n)]
    except OSError:
        return []
    for name in sorted(names):
        path = os.path.join(staging_dir, name)
        try:
            status = json.loads(read_staged(path, MAX_STATUS_BYTES))
        except FileNotFoundError:
            continue  # replaced between the listing and the open: the next reading has it
        except (OSError, ValueError, RecursionError) as exc:
            _note(problems, f"{path}: {str(exc).removeprefix(path + ': ')[:200]}")
            continue
        problem = status_problem(status)
        if problem is None:
            found.append(status)
        else:
            _note(problems, f"{path}: {problem}")
    return found


def _note(problems: list[str] | None, line: str) -> None:
    if problems is not None:
        problems.append(line)

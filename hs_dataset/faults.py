"""Deterministic crash points for fault-injection tests.

Set ``HS_DATASET_CRASH_AT=<point>[:<n>]`` and the process SIGKILLs itself the n-th
time (default 1st) it reaches ``crash_point("<point>")``. Unset, a crash point
costs one dict lookup. Points are listed in :data:`CRASH_POINTS`.
"""

from __future__ import annotations

import os
import signal

__all__ = ["CRASH_POINTS", "crash_point"]

CRASH_POINTS = (
    "shard.mid_write",  # half of a shard's bytes are in the temp file
    "shard.before_publish",  # temp file complete and fsynced, not renamed
    "shard.after_publish",  # renamed into place, manifest not yet updated
    "manifest.mid_write",  # half of the new manifest is in its temp file
    "pipeline.after_batch",  # a capture batch was handed to the writer
    "regenerate.after_turn",  # an answer arrived; its conversation may have turns left, nothing of it stored
    "regenerate.mid_chunk",  # half of a line of finished conversations is in regenerated.jsonl
    "regenerate.after_chunk",  # a line of finished conversations is stored, not yet captured
    "export.mid_file",  # an export file is half written
    "push.before_commit",  # a batch of shards is uploaded to the Hub's storage, its commit not made
    "push.before_last_commit",  # every shard is committed, the commit of the manifest, index and card not made
    "remote.mid_upload",  # half of a file's bytes are sent to object storage, the upload not complete
    "remote.before_manifest",  # a rank's shards are uploaded, its manifest not yet
    "merge.after_copy",  # a remote merge copied one more shard of a part elsewhere, its manifest not written
    "merge.before_manifest",  # a remote merge copied everything, its manifest not written
)

_spec = os.environ.get("HS_DATASET_CRASH_AT", "")
_target, _, _count = _spec.partition(":")
_remaining = {_target: int(_count or 1)} if _target else {}


def crash_point(name: str) -> None:
    """SIGKILL this process here if the environment asks for it (tests only)."""
    if name not in _remaining:
        return
    _remaining[name] -= 1
    if _remaining[name] <= 0:
        os.kill(os.getpid(), signal.SIGKILL)

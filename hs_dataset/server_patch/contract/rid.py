"""Request ids: ``hs-<run>-<seq>-<T>``, the one key between a request and its dump.

``<run>`` is 1-32 of ``[a-z0-9]``, ``<seq>`` a request counter, ``<T>`` the prompt's
token count (the server needs it to know when a chunked prefill is complete).
A *one-pass* request (a generation whose prompt and decode-step states are captured while
the server generates, issue 45) is ``hs-<run>-<seq>-g<T>``: the ``g`` tells the server to keep
every row it computes for it (prefill rows after a prefix-cache hit, then one row per decode
step) as pieces, ``{rid}.{k}.safetensors``, rather than one dump of a whole prompt.
:func:`validate_rid` is the one gate before a rid is used in a file name. Servers that
cannot tell request ids apart key dumps by content instead (:func:`content_key`).
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Sequence

__all__ = [
    "CONTENT_KEY_PREFIX",
    "ONE_PASS_MARK",
    "RID_RE",
    "content_key",
    "is_one_pass",
    "make_one_pass_rid",
    "make_rid",
    "rid_num_tokens",
    "validate_rid",
]

ONE_PASS_MARK = "g"  # before <T>: a one-pass generation request
RID_RE = re.compile(r"\Ahs-(?P<run>[a-z0-9]{1,32})-(?P<seq>[0-9]{1,12})-(?P<kind>g?)(?P<tokens>[1-9][0-9]{0,8})\Z")
_RUN_RE = re.compile(r"\A[a-z0-9]{1,32}\Z")


def validate_rid(rid: object) -> str:
    """Return ``rid`` if it is one of ours and safe as a file name; raise ``ValueError`` otherwise."""
    if not isinstance(rid, str) or RID_RE.match(rid) is None:
        raise ValueError(f"not a valid hs_dataset request id: {rid!r} (expected hs-<run>-<seq>-<tokens>)")
    return rid


def make_rid(run: str, seq: int, num_tokens: int) -> str:
    if not _RUN_RE.match(run):
        raise ValueError(f"run id must be 1-32 characters of [a-z0-9], got {run!r}")
    return validate_rid(f"hs-{run}-{int(seq)}-{int(num_tokens)}")


def make_one_pass_rid(run: str, seq: int, prompt_tokens: int) -> str:
    """The id of a one-pass generation request whose prompt has ``prompt_tokens`` tokens."""
    if not _RUN_RE.match(run):
        raise ValueError(f"run id must be 1-32 characters of [a-z0-9], got {run!r}")
    return validate_rid(f"hs-{run}-{int(seq)}-{ONE_PASS_MARK}{int(prompt_tokens)}")


def is_one_pass(rid: str) -> bool:
    """Whether a valid rid names a one-pass generation request (its states are kept as pieces)."""
    m = RID_RE.match(rid)
    return m is not None and m.group("kind") == ONE_PASS_MARK


def rid_num_tokens(rid: str) -> int:
    """The prompt length encoded in a valid rid."""
    m = RID_RE.match(rid)
    if m is None:
        raise ValueError(f"not a valid hs_dataset request id: {rid!r}")
    return int(m.group("tokens"))


CONTENT_KEY_PREFIX = "ck-"


def content_key(input_ids: Sequence[int]) -> str:
    """File stem used when the server cannot tell request ids (SGLang < 0.5.15): ``ck-`` + sha256 of the ids.

    The ids are hashed as little-endian int64; the client computes the same key.
    """
    tolist = getattr(input_ids, "tolist", None)  # a tensor, without importing torch here
    values = [int(i) for i in (tolist() if tolist is not None else input_ids)]
    data = struct.pack(f"<{len(values)}q", *values)
    return CONTENT_KEY_PREFIX + hashlib.sha256(data).hexdigest()[:40]

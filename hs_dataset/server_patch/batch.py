"""One forward pass as the capture core sees it: :class:`BatchView`, and its split into per-request rows.

Runs inside SGLang scheduler processes (stdlib and torch only). The glue of each
SGLang version reduces its ForwardBatch to a :class:`BatchView`;
:func:`split_requests` then finds the rows of every request that is ours: a rid with
our prefix that passes the strict :data:`~hs_dataset.server_patch.contract.rid.RID_RE` check, or --
on servers whose batches carry no rids (SGLang 0.5.5) -- a whole prompt, keyed by
its content later.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from hs_dataset.server_patch.contract.rid import ONE_PASS_MARK, RID_RE
from hs_dataset.server_patch.contract.status import RECENT_IDS

__all__ = ["DECODE_MODE", "PREFILL_MODES", "BatchSplit", "BatchView", "RequestSlice", "RidKinds", "split_decode", "split_requests"]

# ForwardMode names of the extend-shaped passes that carry prompt rows. MIXED (mixed chunked
# prefill, --enable-mixed-chunk) is new prefill rows followed by 1-row decode tails of running
# requests, all covered by extend_seq_lens/extend_prefix_lens/rids; SGLang 0.5.14-0.5.17 hand it
# to the model as MIXED rather than rewriting it to EXTEND.
PREFILL_MODES = frozenset({"EXTEND", "MIXED"})
# A decode step: one row per running request, in the order of ``rids``, at ``positions`` (one-pass capture only).
DECODE_MODE = "DECODE"


@dataclass
class BatchView:
    """What the core needs from a ForwardBatch (version-independent)."""

    mode: str  # ForwardMode name, e.g. "EXTEND" or "MIXED"
    extend_seq_lens: list[int] | None
    extend_prefix_lens: list[int] | None = None
    rids: list[str] | None = None
    input_ids: torch.Tensor | None = None  # [total tokens] on the model's device
    positions: torch.Tensor | None = None  # [total tokens]: each row's position in its request's sequence

    @classmethod
    def from_forward_batch(cls, fb: Any, input_ids: torch.Tensor | None = None) -> BatchView:
        mode = getattr(fb, "forward_mode", None)
        name = getattr(mode, "name", None) or str(mode)
        seq = getattr(fb, "extend_seq_lens_cpu", None)
        prefix = getattr(fb, "extend_prefix_lens_cpu", None)
        rids = getattr(fb, "rids", None)
        ids = getattr(fb, "input_ids", None)
        if ids is None:
            ids = input_ids
        positions = getattr(fb, "positions", None)
        return cls(
            mode=name,
            extend_seq_lens=[int(x) for x in seq] if seq is not None else None,
            extend_prefix_lens=[int(x) for x in prefix] if prefix is not None else None,
            rids=list(rids) if rids is not None else None,
            input_ids=ids,
            positions=positions if isinstance(positions, torch.Tensor) else None,
        )


class RequestSlice(NamedTuple):
    """Where one of our requests' rows lie in the pass (a tuple: one is made per request, on the forward thread)."""

    key: str  # the rid; "" for a request keyed by its content (a batch without rids)
    offset: int  # first row of the request in the pass
    length: int  # rows this pass computed for it
    prefix: int  # tokens of the request before these rows (chunked prefill; 0 for a whole prompt)
    one_pass: bool = False  # a one-pass generation (its rows are kept as pieces)


FOREIGN, INVALID, OURS, ONE_PASS = "foreign", "invalid", "ours", "one_pass"


class RidKinds:
    """What each rid is (another client's, ours but malformed, ours, ours and one pass), remembered.

    Why remembered: a decode step holds the same rids for hundreds of steps, and matching each
    against :data:`RID_RE` twice a step was most of the forward thread's capture time (128
    requests decoding: about 1 ms a step, beside a step of under 10 ms). At ``limit`` rids
    the memory starts over (the forward thread alone uses it: no lock).
    """

    def __init__(self, rid_prefix: str, limit: int = 1 << 16) -> None:
        self.rid_prefix = rid_prefix
        self.limit = int(limit)
        self._known: dict[str, str] = {}

    def of(self, key: object) -> str:
        if not isinstance(key, str):
            return FOREIGN
        kind = self._known.get(key)
        if kind is None:
            kind = self._classify(key)
            if len(self._known) >= self.limit:
                self._known.clear()
            self._known[key] = kind
        return kind

    def _classify(self, key: str) -> str:
        if not key.startswith(self.rid_prefix):
            return FOREIGN
        m = RID_RE.match(key)
        if m is None:
            return INVALID
        return ONE_PASS if m.group("kind") == ONE_PASS_MARK else OURS


@dataclass
class BatchSplit:
    """The requests of one pass: ours, and the counts of the others."""

    ours: list[RequestSlice]
    requests: int  # requests in the pass
    rows: int  # rows the pass extends, over all its requests
    foreign: int = 0  # rids without our prefix (warm-up, health checks, other clients)
    foreign_rids: list[str] = field(default_factory=list)  # the first few of them, as strings (for the status file)
    invalid_rids: list[str] = field(default_factory=list)  # our prefix, but not hs-<run>-<seq>-<T>


def split_requests(batch: BatchView, kinds: RidKinds, content_keys: bool) -> BatchSplit:
    """Split an extend-shaped pass (:data:`PREFILL_MODES`, ``extend_seq_lens`` set) into the rows of each request, by ``extend_seq_lens``."""
    lens = batch.extend_seq_lens
    rids = batch.rids
    n = len(rids) if rids is not None else len(lens)
    n = min(n, len(lens))
    prefix = batch.extend_prefix_lens or [0] * len(lens)
    split = BatchSplit(ours=[], requests=n, rows=0)
    offset = 0
    for i in range(n):
        length, pre = int(lens[i]), int(prefix[i])
        if rids is not None:
            key, kind = rids[i], kinds.of(rids[i])
            if kind in (OURS, ONE_PASS):
                split.ours.append(RequestSlice(key, offset, length, pre, kind == ONE_PASS))
            else:
                _not_ours(split, key, kind)
        elif content_keys and pre == 0 and batch.input_ids is not None:
            split.ours.append(RequestSlice("", offset, length, pre))  # keyed by content once its rows are taken
        offset += length
    split.rows = offset
    return split


def split_decode(batch: BatchView, kinds: RidKinds) -> BatchSplit:
    """Split a decode step into one row per request, in the order of ``rids`` (a batch without rids has none of ours)."""
    rids = batch.rids or []
    split = BatchSplit(ours=[], requests=len(rids), rows=len(rids))
    for i, key in enumerate(rids):
        kind = kinds.of(key)
        if kind in (OURS, ONE_PASS):  # prefix unknown here: the row's position says where it is
            split.ours.append(RequestSlice(key, i, 1, -1, kind == ONE_PASS))
        else:
            _not_ours(split, key, kind)
    return split


def _not_ours(split: BatchSplit, key: object, kind: str) -> None:
    """Count a rid that is not ours (the first few kept for the status file), or note one of ours that is malformed."""
    if kind == INVALID:
        split.invalid_rids.append(str(key))
        return
    split.foreign += 1
    if len(split.foreign_rids) < RECENT_IDS:
        split.foreign_rids.append(str(key)[:120])

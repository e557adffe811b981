"""One-pass capture on the client: a regenerated conversation's states, assembled by position from its generations.

Each generation of a conversation ran under a one-pass request id, so the server kept every row it
computed for it: the prompt's rows after any prefix-cache hit, then one row per decode step
(``server_patch/one_pass.py``). The stored sample is the last generation's prompt and answer
(``regenerate/turns.py``), so its positions are covered by

* the generations whose token stream agrees with the sample up to that position: a state depends on
  every token before it, so a generation's rows count only inside its common prefix with the sample
  (an earlier turn that the template rendered differently counts up to where it differs);
* what no generation computed: positions another conversation's request put into the prefix cache
  (a shared system prompt), the answer's last token (sampled, never fed back, unless the overlap
  scheduler ran one more step), rows lost with a refused piece. A range that a recently assembled
  sample holds with the same tokens before it is copied from there (:class:`SharedPrefixes`: a state
  depends only on the tokens up to it, which is also why the server may share that prefix's KV). The rest is *repaired*: one request per missing range ``[a, b)``
  sends ``ids[:b]`` with ``logprob_start_len = a`` (SGLang then recomputes every position from ``a``,
  taking ``[0, a)`` from its cache) under a one-pass id, and its rows fill the range. Repaired tokens are
  the only prefill capture adds to generation; they are counted.

A position is filled once, by the first row that arrives for it. Every piece is checked before use
(``pieces.py``); a bad piece, a refusal marker or a range still missing after its repair gives up on
one pass for this conversation, and the caller captures it by prefill as before. Nothing partial is stored.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from hs_dataset.capture.sglang.dumps import ExpectedDump
from hs_dataset.capture.sglang.pieces import Piece, PieceListing, list_pieces, read_piece
from hs_dataset.codecs.fp8 import SCALE_SUFFIX
from hs_dataset.regenerate.generator import TracedGeneration
from hs_dataset.sample import CapturedSample, TokenizedSample
from hs_dataset.server_patch.contract.dump import REFUSED_SUFFIX
from hs_dataset.server_patch.contract.rid import rid_num_tokens
from hs_dataset.server_patch.contract.spares import hand_back_dump

__all__ = ["Assembly", "SharedPrefixes", "Source", "common_prefix", "missing_ranges"]


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many leading ids ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0, 0]) if len(differ) else n


def missing_ranges(filled: torch.Tensor) -> list[tuple[int, int]]:
    """``[a, b)`` of every run of unfilled positions."""
    out: list[tuple[int, int]] = []
    for i in (~filled).nonzero().flatten().tolist():
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


@dataclass
class Source:
    """One request whose rows may fill the sample: its id, its server's staging dir, its ids, and what it must deliver.

    ``usable``: its rows count below this position (its common prefix with the sample).
    ``expected``: positions it computed for sure (after its prefix-cache hit, before its last, unfed token).
    """

    rid: str
    staging_dir: str
    ids: torch.Tensor
    usable: int
    expected: range
    seen: set[str] = field(default_factory=set)  # piece files already taken

    @classmethod
    def of_generation(cls, gen: TracedGeneration, staging_dir: str, sample_ids: torch.Tensor) -> Source:
        ids = torch.tensor(gen.ids, dtype=torch.int64)
        usable = common_prefix(ids, sample_ids)
        prompt = rid_num_tokens(gen.trace.rid)
        cached = gen.trace.cached_tokens if gen.trace.cached_tokens is not None else prompt  # unknown: count on decode rows only
        return cls(gen.trace.rid, staging_dir, ids, usable, range(min(cached, usable), min(len(ids) - 1, usable)))

    @classmethod
    def of_repair(cls, rid: str, staging_dir: str, sample_ids: torch.Tensor, start: int, stop: int) -> Source:
        return cls(rid, staging_dir, sample_ids[:stop], stop, range(start, stop))

    def refusal_path(self) -> str:
        return os.path.join(self.staging_dir, self.rid + REFUSED_SUFFIX)

    def new_pieces(self, listing: PieceListing | None = None) -> list[str]:
        """Its pieces not taken yet, from ``listing`` (shared, of its staging dir) or a listing of its own."""
        found = listing.pieces(self.rid) if listing is not None else list_pieces(self.staging_dir, self.rid)
        return [p for p in found if p not in self.seen]


class Assembly:
    """The sample's states as rows arrive: a buffer per tensor, and which positions are filled."""

    def __init__(self, sample: TokenizedSample, expected: ExpectedDump) -> None:
        self.sample = sample
        self.expected = expected
        self.filled = torch.zeros(sample.num_tokens, dtype=torch.bool)
        self.tensors: dict[str, torch.Tensor] = {}
        self.encoding: str | None = None
        self.dtype: str | None = None
        self._lock = threading.Lock()  # repairs of one sample run at once: their pieces are taken on executor threads

    def take(self, source: Source, path: str) -> None:
        """Read piece ``path`` of ``source``, fill the positions it holds that are still empty, hand the file back.

        Raises :class:`~hs_dataset.capture.sglang.pieces.PieceError` for a piece that is not its request's rows.
        """
        source.seen.add(path)
        try:
            piece = read_piece(path, source.rid, source.ids, self.expected)
        finally:
            hand_back_dump(path)  # read into our memory (or refused): the server may write over it
        with self._lock:
            self._fill(piece, source.usable)

    def _fill(self, piece: Piece, usable: int) -> None:
        if self.encoding is None:
            self.adopt_layout(piece.tensors, piece.encoding, piece.dtype)
        elif (piece.encoding, piece.dtype) != (self.encoding, self.dtype) or set(piece.tensors) != set(self.tensors):
            raise ValueError(f"pieces of one conversation disagree: {piece.encoding}/{piece.dtype} after {self.encoding}/{self.dtype}")
        positions = piece.positions
        keep = positions < min(usable, self.sample.num_tokens)
        rows = keep.nonzero().flatten()
        pos = positions[rows]
        fresh = ~self.filled[pos]
        # the first row that arrives for a position wins: of duplicates within this piece too
        first = torch.zeros_like(fresh)
        if len(pos):
            order = torch.argsort(pos, stable=True)
            sorted_pos = pos[order]
            lead = torch.ones_like(sorted_pos, dtype=torch.bool)
            lead[1:] = sorted_pos[1:] != sorted_pos[:-1]
            first[order[lead]] = True
        take = fresh & first
        rows, pos = rows[take], pos[take]
        for name, buf in self.tensors.items():
            buf[pos] = piece.tensors[name][rows]
        self.filled[pos] = True

    def fill_range(self, rows: dict[str, torch.Tensor], encoding: str | None, dtype: str | None, start: int, stop: int) -> None:
        """Positions ``[start, stop)`` from ``rows`` (indexed by position, of this encoding), whatever was there."""
        with self._lock:  # a repair's piece may be being taken meanwhile
            if self.encoding is None:
                self.adopt_layout(rows, encoding, dtype)
            for name, buf in self.tensors.items():
                buf[start:stop] = rows[name][start:stop]
            self.filled[start:stop] = True

    def adopt_layout(self, rows: dict[str, torch.Tensor], encoding: str | None, dtype: str | None) -> None:
        """Allocate the sample's buffers like ``rows`` (the first rows that arrive decide the encoding)."""
        self.encoding, self.dtype = encoding, dtype
        n = self.sample.num_tokens
        self.tensors = {name: t.new_empty((n, *t.shape[1:])) for name, t in rows.items()}

    def covers(self, sources: Iterable[Source]) -> bool:
        """Whether every position the sources must deliver is filled."""
        for s in sources:
            r = s.expected
            if len(r) and not bool(self.filled[r.start : min(r.stop, len(self.filled))].all()):
                return False
        return True

    def missing(self) -> list[tuple[int, int]]:
        return missing_ranges(self.filled)

    def result(self) -> CapturedSample:
        """The sample with its assembled states (only when every position is filled)."""
        if not bool(self.filled.all()):
            raise ValueError(f"{self.sample.sample_id}: positions {self.missing()[:4]} were never filled")
        scaled = self.encoding not in (None, "native")
        return CapturedSample(
            sample_id=self.sample.sample_id,
            input_ids=self.sample.input_ids,
            loss_mask=self.sample.loss_mask,
            aux_hidden_states=self.tensors["aux_hidden_states"],
            final_hidden_state=self.tensors["final_hidden_state"],
            aux_scale=self.tensors.get("aux_hidden_states" + SCALE_SUFFIX) if scaled else None,
            final_scale=self.tensors.get("final_hidden_state" + SCALE_SUFFIX) if scaled else None,
        )


class SharedPrefixes:
    """The leading rows of the last few assembled samples, for ranges a shared prefix-cache hit left empty.

    Bounded: ``entries`` samples, each at most ``tokens`` leading rows (at Kimi-K2.5 width, 3 aux layers and
    the final state in bf16, 8 x 256 rows are 117 MB). Used from the capture loop's thread only.
    """

    def __init__(self, entries: int = 8, tokens: int = 256) -> None:
        self.entries, self.tokens = int(entries), int(tokens)
        self._held: OrderedDict[int, tuple[torch.Tensor, dict[str, torch.Tensor], str | None, str | None]] = OrderedDict()
        self._next = 0

    def remember(self, assembly: Assembly) -> None:
        """Keep the leading rows of a complete assembly (copies: the sample's own tensors go to the writer)."""
        if self.entries < 1 or not bool(assembly.filled.all()):
            return
        n = min(self.tokens, assembly.sample.num_tokens)
        rows = {name: t[:n].clone() for name, t in assembly.tensors.items()}
        self._held[self._next] = (assembly.sample.input_ids[:n].clone(), rows, assembly.encoding, assembly.dtype)
        self._next += 1
        while len(self._held) > self.entries:
            self._held.popitem(last=False)

    def fill(self, assembly: Assembly, start: int, stop: int) -> bool:
        """Fill ``[start, stop)`` of ``assembly`` from a held sample with the same first ``stop`` tokens; whether one did."""
        for key, (ids, rows, encoding, dtype) in reversed(self._held.items()):
            if len(ids) < stop or common_prefix(ids[:stop], assembly.sample.input_ids[:stop]) < stop:
                continue
            if assembly.encoding is not None and (encoding, dtype) != (assembly.encoding, assembly.dtype):
                continue
            assembly.fill_range(rows, encoding, dtype, start, stop)
            self._held.move_to_end(key)
            return True
        return False

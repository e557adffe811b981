"""One piece of a one-pass generation on the client: found, read as the untrusted file it is, and checked.

The server writes the rows it computed for a one-pass request as pieces ``{rid}.{k}.safetensors``
(``server_patch/contract/dump.py``): token ids, each row's position, and the states. A piece is
checked against the generation it belongs to before any row is used: its header must declare
at most what the generation can hold (rows, layers, width, encoding), every position must lie in
the generation's sequence, and every row's token id must be the id at that position. A piece that
fails any check is never used: the conversation is then captured by prefill (``one_pass.py``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from hs_dataset.capture.sglang.dumps import (
    MAX_HIDDEN,
    ExpectedDump,
    HeaderRefused,
    encoding_problem,
    metadata_problem,
    read_dump,
    scaled_encoding,
)
from hs_dataset.codecs.fp8 import SCALE_SUFFIX, STATE_ENCODING_KEY
from hs_dataset.codecs.safetensors_layout import TensorSpec
from hs_dataset.errors import CaptureError
from hs_dataset.server_patch.contract.dump import ONE_PASS_PATH, parse_piece_name, piece_number

__all__ = ["MAX_REPEATS", "Piece", "PieceError", "PieceListing", "list_pieces", "read_piece"]

STATES = ("aux_hidden_states", "final_hidden_state")
# A request's rows may come more than once (a retracted request is prefilled again), but not without bound:
# a piece declaring more rows than this many times the generation's length is refused before it is read.
MAX_REPEATS = 4
# Rows past the answer: a scheduler that sees a request finish a step or two late (SGLang's overlap scheduler)
# decodes it once or twice more, feeding tokens the answer does not hold. Such rows are dropped, not trusted;
# one further away than this is no late step but a wrong piece.
MAX_STEPS_PAST = 4


class PieceError(CaptureError):
    """A piece that is not the rows of its generation; its text names the piece and what is wrong."""


@dataclass(frozen=True)
class Piece:
    """The checked rows of one piece: positions ``[n]``, the states' tensors by name, and how they are encoded."""

    positions: torch.Tensor
    tensors: dict[str, torch.Tensor]
    encoding: str
    dtype: str


def list_pieces(staging_dir: str, rid: str) -> list[str]:
    """Paths of the pieces of ``rid`` now in ``staging_dir`` (in-progress files start with ``.`` and are skipped)."""
    try:
        names = os.listdir(staging_dir)
    except FileNotFoundError:
        return []
    found = [(k, name) for name in names if (k := piece_number(rid, name)) is not None]
    return [os.path.join(staging_dir, name) for _, name in sorted(found)]


class PieceListing:
    """The pieces in one staging dir by request, from one listing shared by every conversation being assembled.

    Why: each conversation waiting for its rows listed the whole dir itself, so with 128 of them
    polling every name was read 128 times a tick (34 CPU s of the client over a 50 s GPU build).
    A listing is reused for ``max_age_s``: a piece is seen at most that much later.
    """

    def __init__(self, staging_dir: str, max_age_s: float = 0.005) -> None:
        self.staging_dir = staging_dir
        self.max_age_s = max_age_s
        self._at = float("-inf")
        self._by_rid: dict[str, list[str]] = {}

    def pieces(self, rid: str) -> list[str]:
        """Paths of ``rid``'s pieces, in piece order, as of a listing at most ``max_age_s`` old."""
        if time.monotonic() - self._at > self.max_age_s:
            self._refresh()
        return self._by_rid.get(rid, [])

    def _refresh(self) -> None:
        try:
            names = os.listdir(self.staging_dir)
        except FileNotFoundError:
            names = []
        found: dict[str, list[tuple[int, str]]] = {}
        for name in names:
            if (parsed := parse_piece_name(name)) is not None:
                found.setdefault(parsed[0], []).append((parsed[1], name))
        self._by_rid = {rid: [os.path.join(self.staging_dir, n) for _, n in sorted(ks)] for rid, ks in found.items()}
        self._at = time.monotonic()


def read_piece(path: str, rid: str, ids: torch.Tensor, expected: ExpectedDump) -> Piece:
    """Read piece ``path`` of one-pass request ``rid`` whose sequence is ``ids``; raise :class:`PieceError`."""
    name = os.path.basename(path)
    try:
        meta, tensors = read_dump(path, lambda specs, meta: _header_problem(specs, meta, name, rid, len(ids), expected))
    except PieceError:
        raise
    except HeaderRefused as exc:  # the header check's words name the piece already
        raise PieceError(str(exc)) from None
    except Exception as exc:  # StagedFileError, a torn or planted file
        raise PieceError(f"one-pass piece {name}: {exc}") from None
    problem = _rows_problem(tensors, ids, name) or encoding_problem(meta, tensors, name, expected)
    if problem:
        raise PieceError(problem)
    states = {k: v for k, v in tensors.items() if k not in ("input_ids", "positions")}
    return Piece(tensors["positions"], states, meta.get(STATE_ENCODING_KEY, "native"), str(meta.get("dtype")))


def _header_problem(
    specs: dict[str, TensorSpec], meta: dict[str, str], name: str, rid: str, length: int, expected: ExpectedDump
) -> str | None:
    """The header names this request (the metadata check dumps share) and declares rows of its width, before a byte
    of data is read."""
    problem = metadata_problem(meta, f"one-pass piece {name}", rid, expected, capture_path=ONE_PASS_PATH)
    return problem or _shapes_problem(specs, meta, name, length, expected)


def _shapes_problem(specs: dict[str, TensorSpec], meta: dict[str, str], name: str, length: int, expected: ExpectedDump) -> str | None:
    encoding = scaled_encoding(meta)
    allowed = {"input_ids", "positions", *STATES, *((s + SCALE_SUFFIX for s in STATES) if encoding is not None else ())}
    if set(specs) - allowed or not {"input_ids", "positions", *STATES} <= set(specs):
        return f"one-pass piece {name} holds tensors {sorted(specs)[:8]}, expected {sorted(allowed)}"
    n = specs["input_ids"].shape[0] if len(specs["input_ids"].shape) == 1 else -1
    if not 0 < n <= MAX_REPEATS * length or specs["positions"].shape != (n,):
        return f"one-pass piece {name}: {specs['input_ids'].shape} rows, expected 1 to {MAX_REPEATS * length}"
    if specs["input_ids"].dtype != "I64" or specs["positions"].dtype != "I64":
        return f"one-pass piece {name}: token ids and positions must be int64"
    aux, final = specs["aux_hidden_states"].shape, specs["final_hidden_state"].shape
    k = len(expected.aux_layer_ids)
    if len(aux) != 3 or aux[:2] != (n, k) or final != (n, aux[2]):
        return f"one-pass piece {name}: states {aux} and {final}, expected [{n}, {k}, H] and [{n}, H]"
    hidden = aux[2] * (encoding.pack if encoding is not None else 1)
    if (expected.hidden_size is not None and hidden != expected.hidden_size) or hidden > MAX_HIDDEN:
        return f"one-pass piece {name}: hidden size {hidden}, expected {expected.hidden_size}"
    for scale in (s + SCALE_SUFFIX for s in STATES):
        if scale in specs and specs[scale].nbytes > specs[scale.removesuffix(SCALE_SUFFIX)].nbytes:
            return f"one-pass piece {name}: tensor {scale} is larger than the states it scales"
    return None


def _rows_problem(tensors: dict[str, torch.Tensor], ids: torch.Tensor, name: str) -> str | None:
    """Every row's position lies in the generation's sequence (or a late step or two past it, see
    :data:`MAX_STEPS_PAST`) and, inside it, its token id is the one there."""
    positions, row_ids = tensors["positions"], tensors["input_ids"]
    if int(positions.min()) < 0 or int(positions.max()) >= len(ids) + MAX_STEPS_PAST:
        return f"one-pass piece {name}: positions {int(positions.min())}..{int(positions.max())} outside the request's {len(ids)} tokens"
    inside = positions < len(ids)
    wrong = (ids[positions[inside]] != row_ids[inside]).nonzero()
    if len(wrong):
        at = int(positions[inside][wrong[0, 0]])
        return f"one-pass piece {name}: the row at position {at} holds token {int(row_ids[inside][wrong[0, 0]])}, the request has {int(ids[at])}"
    return None

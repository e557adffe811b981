"""The static rows a decode CUDA graph writes the hooks' states into, read after each replay.

A hook's Python runs only while a graph is captured; what it does to the device then is
recorded and replayed with every step. So during capture the norm and layer hooks copy
their states into buffers that outlive the capture: one ``[R, K, H]`` for the aux layers and
one ``[R, H]`` for the pre-norm final state, ``R`` the rows of the largest graph. SGLang
captures its decode graphs largest batch first, so the first capture sizes them; every
smaller graph writes their first rows. After a replay, the first ``batch_size`` rows are
that step's states (a graph runs a padded batch: the rows past the real ones are padding).

At the end of each capture the model hook also records the packing of those rows, with each
row's token id and position and quantized where the card stores fp8 or 4-bit states, into one
static ``[R, row_bytes]`` record (:mod:`.row_record`): a replay then leaves the step's rows as
one contiguous block, which the forward thread copies to the host in one copy, its Python
(the quantizer's launch, a copy per tensor) left in the graph.

Imports torch and this package's server side only.
"""

from __future__ import annotations

from typing import TypeGuard

import torch

from hs_dataset.server_patch.row_record import RecordLayout, row_columns
from hs_dataset.server_patch.states import pass_states

__all__ = ["GraphBuffers"]


class GraphBuffers:
    """The two static buffers of one model's decode graphs, and what went wrong filling them (a reason, or None)."""

    def __init__(self, aux_layers: int, encoding: str | None = None) -> None:
        self.aux_layers = aux_layers
        self.encoding = encoding  # the card's state encoding (None: the states as computed)
        self.aux: torch.Tensor | None = None  # [R, K, H]
        self.final: torch.Tensor | None = None  # [R, H]
        self.record: torch.Tensor | None = None  # [R, row_bytes]: each row's id, position and (encoded) states
        self.layout: RecordLayout | None = None  # the record's columns, the same for every captured batch size
        self.state_dtype = ""  # the dtype the model computed the states in
        self._capture_rows = 0  # rows of the capture under way (its final state's)
        self.captures = 0  # graph captures the model hook saw (one per captured batch size)
        self.final_written = False  # the norm hook recorded its copy in the capture under way
        self.layers_written: set[int] = set()  # ... and the aux slots the layer hooks recorded
        self.problem: str | None = None

    @property
    def rows(self) -> int:
        return 0 if self.final is None else int(self.final.shape[0])

    def _static(self, name: str, rows: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
        """Buffer ``name`` (``aux``, ``final`` or ``record``), made at the first (largest) capture; None once it cannot hold these rows."""
        buf = getattr(self, name)
        if buf is None:
            buf = torch.zeros((rows, *shape), dtype=dtype, device=device)
            setattr(self, name, buf)
        if rows > buf.shape[0] or tuple(buf.shape[1:]) != shape or buf.dtype != dtype:
            self.fail(
                f"a decode graph of {rows} rows of {list(shape)} {dtype} was captured after one of {buf.shape[0]} rows of "
                f"{list(buf.shape[1:])} {buf.dtype}: its states do not fit the static {name} buffer"
            )
            return None
        return buf

    def keep_layer(self, slot: int, hidden: torch.Tensor, residual: torch.Tensor | None) -> None:
        """Record the copy of aux layer ``slot``'s output (plus the residual it carries) into the static rows."""
        dtype = torch.result_type(hidden, residual) if residual is not None else hidden.dtype
        rows = hidden.shape[0]
        buf = self._static("aux", rows, (self.aux_layers, hidden.shape[-1]), dtype, hidden.device)
        if buf is None:
            return
        if residual is not None:
            torch.add(hidden, residual, out=buf[:rows, slot])
        else:
            buf[:rows, slot].copy_(hidden)
        self.layers_written.add(slot)

    def keep_final(self, prenorm: torch.Tensor) -> None:
        """Record the copy of the pre-norm final state into the static rows."""
        rows = prenorm.shape[0]
        buf = self._static("final", rows, (prenorm.shape[-1],), prenorm.dtype, prenorm.device)
        if buf is not None:
            buf[:rows].copy_(prenorm)
            self.final_written = True
            self._capture_rows = rows

    def captured(self) -> None:
        """One graph's capture ended (the model hook): it must have recorded the final state and every aux layer."""
        self.captures += 1
        if not self.final_written:
            self.fail("the final-norm hook did not run while a decode graph was captured (a norm fused away?)")
        elif len(self.layers_written) != self.aux_layers:
            self.fail(f"{len(self.layers_written)} of {self.aux_layers} aux layer hooks ran while a decode graph was captured")
        self.final_written, self.layers_written = False, set()

    def fail(self, reason: str) -> None:
        if self.problem is None:
            self.problem = reason

    def keep_record(self, input_ids: object, positions: object) -> None:
        """Record the packing of the capture's rows into the static record (the model hook, after :meth:`captured`).

        ``input_ids`` and ``positions``: what the model was handed (the graph's static
        inputs), so a replay packs each row's own token and position beside its states.
        """
        rows = self._capture_rows
        if self.problem is not None or self.final is None or not rows:
            return
        if not (_row_index(input_ids, rows) and _row_index(positions, rows)):
            self.fail(
                "the model was not handed the token ids and positions as its first two arguments while a decode graph was "
                "captured: the replayed rows cannot be placed"
            )
            return
        final = self.final[:rows]
        aux = self.aux[:rows] if self.aux is not None else final.new_empty((rows, 0, final.shape[-1]))
        states, _ = pass_states(aux, final, rows, self.encoding)  # the quantizer's kernels are recorded too
        tensors = row_columns(input_ids[:rows], positions[:rows], states)
        layout = RecordLayout.of(tensors)
        if self.layout is not None and layout != self.layout:
            self.fail(f"a decode graph's rows pack as {layout}, an earlier one's as {self.layout}")
            return
        record = self._static("record", rows, (layout.row_bytes,), torch.uint8, final.device)
        if record is None:
            return
        self.layout, self.state_dtype = layout, str(aux.dtype).replace("torch.", "")
        layout.pack(record[:rows], tensors)

    def replayed(self, batch_size: int) -> tuple[torch.Tensor, RecordLayout]:
        """The replayed step's first ``batch_size`` record rows (a view the next replay overwrites), and their layout."""
        if self.record is None or self.layout is None or batch_size > self.record.shape[0]:
            raise ValueError(f"a replayed decode batch of {batch_size} rows does not fit the static record ({self.rows} rows)")
        return self.record[:batch_size], self.layout


def _row_index(t: object, rows: int) -> TypeGuard[torch.Tensor]:
    """Whether ``t`` is one value a row (token ids, positions) for at least ``rows`` rows."""
    return isinstance(t, torch.Tensor) and t.dim() == 1 and t.shape[0] >= rows

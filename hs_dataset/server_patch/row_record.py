"""Rows of several tensors packed as one byte record per row, so a decode step's rows cross to the host in one copy.

Runs inside SGLang scheduler processes (torch only). Why: a one-pass decode step keeps, for each
request, its token id, its position, the aux states and the final state (and their scales where
the card stores fp8 or 4-bit states): six tensors. Copied as six tensors, the scheduler thread
issues six copies, views and snapshots a step, and the collector files six tensors a step, all
Python on the thread SGLang's decode loop needs (the 2026-12-07 GPU profile: about 1.2 ms of
hooks a decode step at 128 requests; docs/GPU.md). Inside a decode CUDA graph the hooks instead
pack each row's bytes into one static ``[rows, row_bytes]`` record, recorded with the graph, so
that a replay writes them and the step's rows are one contiguous block: one copy to the host,
one tensor to file. :meth:`RecordLayout.split` gives the named tensors back as views of it.

Each column starts at a multiple of :data:`ALIGN` bytes and the row is padded to one, so every
column can be viewed as its own dtype and a row as 16-byte words (the collector's copies).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

__all__ = ["ALIGN", "RECORD", "Column", "RecordLayout", "packed", "row_columns"]

ALIGN = 16  # bytes: the widest word the collector moves rows as (complex128)
RECORD = "record"  # the name a record block travels under to the collector


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class Column:
    """One tensor's bytes within a row: ``[offset, offset + nbytes)``, a row of ``shape`` in ``dtype``."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class RecordLayout:
    """Where each named tensor's row lies in a record row, and the row's size (a multiple of :data:`ALIGN`)."""

    columns: tuple[Column, ...]
    row_bytes: int

    @classmethod
    def of(cls, tensors: Mapping[str, torch.Tensor]) -> RecordLayout:
        """The layout of rows of ``tensors`` (each ``[rows, *shape]``), in their order."""
        columns, offset = [], 0
        for name, t in tensors.items():
            shape = tuple(t.shape[1:])
            nbytes = math.prod(shape) * t.element_size()
            columns.append(Column(name, t.dtype, shape, offset, nbytes))
            offset = _aligned(offset + nbytes)
        return cls(tuple(columns), max(offset, ALIGN))

    def pack(self, record: torch.Tensor, tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy ``tensors`` (``rows`` rows each, this layout's names and row shapes) into ``record [rows, row_bytes]``.

        One copy per column; dtypes convert on the way (an int32 token id lands as the
        column's int64). Inside a graph capture the copies are recorded with it.
        """
        rows = record.shape[0]
        for column in self.columns:
            if column.nbytes:
                self._view(record, column, rows).copy_(tensors[column.name][:rows])

    def split(self, record: torch.Tensor) -> dict[str, torch.Tensor]:
        """The named tensors of ``record [rows, row_bytes]`` as views of it (rows apart by ``row_bytes``)."""
        rows = record.shape[0]
        return {column.name: self._view(record, column, rows) for column in self.columns}

    @staticmethod
    def _view(record: torch.Tensor, column: Column, rows: int) -> torch.Tensor:
        if not column.nbytes:
            return torch.empty((rows, *column.shape), dtype=column.dtype, device=record.device)
        return record[:, column.offset : column.offset + column.nbytes].view(column.dtype).view(rows, *column.shape)


def row_columns(input_ids: torch.Tensor, positions: torch.Tensor, states: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A pass's one-pass rows as the record's columns, in their one order: token id and position as int64, then the states.

    Both routes (the decode graph's static record and the eager pass's) take their columns from here, so their
    layouts are equal and the collector keeps one store for both.
    """
    return {"input_ids": input_ids.to(torch.int64), "positions": positions.to(torch.int64), **states}


def packed(tensors: Mapping[str, torch.Tensor]) -> tuple[RecordLayout, torch.Tensor]:
    """``tensors`` (``rows`` rows each) packed into a new ``[rows, row_bytes]`` record on their device, and its layout."""
    layout = RecordLayout.of(tensors)
    first = next(iter(tensors.values()))
    record = torch.empty((first.shape[0], layout.row_bytes), dtype=torch.uint8, device=first.device)
    layout.pack(record, tensors)
    return layout, record

"""The static rows a decode CUDA graph writes the hooks' states into, read after each replay.

A hook's Python runs only while a graph is captured; what it does to the device then is
recorded and replayed with every step. So during capture the norm and layer hooks copy
their states into buffers that outlive the capture: one ``[R, K, H]`` for the aux layers and
one ``[R, H]`` for the pre-norm final state, ``R`` the rows of the largest graph. SGLang
captures its decode graphs largest batch first, so the first capture sizes them; every
smaller graph writes their first rows. After a replay, the first ``batch_size`` rows are
that step's states (a graph runs a padded batch: the rows past the real ones are padding).

Imports torch only.
"""

from __future__ import annotations

import torch

__all__ = ["GraphBuffers"]


class GraphBuffers:
    """The two static buffers of one model's decode graphs, and what went wrong filling them (a reason, or None)."""

    def __init__(self, aux_layers: int) -> None:
        self.aux_layers = aux_layers
        self.aux: torch.Tensor | None = None  # [R, K, H]
        self.final: torch.Tensor | None = None  # [R, H]
        self.captures = 0  # graph captures the model hook saw (one per captured batch size)
        self.final_written = False  # the norm hook recorded its copy in the capture under way
        self.layers_written: set[int] = set()  # ... and the aux slots the layer hooks recorded
        self.problem: str | None = None

    @property
    def rows(self) -> int:
        return 0 if self.final is None else int(self.final.shape[0])

    def _static(self, name: str, rows: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
        """Buffer ``name`` (``aux`` or ``final``), made at the first (largest) capture; None once it cannot hold these rows."""
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

    def replayed(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of the first ``batch_size`` rows: the replayed step's aux and final states (the next replay overwrites them).

        With no aux layer (the final state only) the aux part is an empty ``[B, 0, H]``.
        """
        if self.final is None or batch_size > self.rows:
            raise ValueError(f"a replayed decode batch of {batch_size} rows does not fit the static buffer ({self.rows} rows)")
        final = self.final[:batch_size]
        aux = self.aux[:batch_size] if self.aux is not None else final.new_empty((batch_size, 0, final.shape[-1]))
        return aux, final

"""The backend interface every capture path (in-process HF, SGLang client) implements.

A backend turns :class:`TokenizedSample` s into :class:`CapturedSample` s. It also
describes *exactly* what it captures (:class:`CaptureInfo`), because the meaning of
"layer 30" and "final state" differs between tools; the description is copied into
the dataset manifest.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence, Union

import torch

from hs_dataset.sample import CapturedSample, TokenizedSample

__all__ = ["CaptureInfo", "CaptureFailure", "CaptureResult", "CaptureBackend"]


@dataclass
class CaptureInfo:
    """What a backend captures, in the convention the manifest records.

    ``aux_layer_ids`` are indexes into transformers' ``output_hidden_states`` tuple:
    ``hidden_states[0]`` is the embedding output and ``hidden_states[i]`` the output of
    decoder layer ``i-1`` (the residual stream entering layer ``i``).
    ``final_state`` is ``"pre_norm"`` (output of the last decoder layer, before the
    model's final norm) or ``"post_norm"``.
    """

    model_path: str
    model_fingerprint: str
    aux_layer_ids: list[int]
    hidden_size: int
    num_hidden_layers: int
    dtype: torch.dtype
    final_state: str = "pre_norm"
    final_norm_eps: float | None = None
    final_norm_weight: torch.Tensor | None = None  # [H], stored next to the shards
    model_revision: str | None = None
    vocab_size: int | None = None
    backend: str = ""
    backend_details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CaptureFailure:
    """A sample the backend could not capture; the pipeline reports it, never drops it silently."""

    sample_id: str
    reason: str


CaptureResult = Union[CapturedSample, CaptureFailure]


class CaptureBackend(abc.ABC):
    """Base class of capture backends.

    Subclasses implement :meth:`info` and :meth:`capture_batch`; backends that can keep
    many requests in flight (the SGLang client) override :meth:`capture_stream`.
    """

    # True when a sample's bytes depend on which samples share its batch (padded
    # forwards): the pipeline then forms batches from fixed windows of the source
    # order, so a resumed build stores the same bytes as an uninterrupted one.
    fixed_batches: bool = False

    @abc.abstractmethod
    def info(self) -> CaptureInfo:
        """Describe the captured states (model, layers, norm); called once before work starts."""

    @abc.abstractmethod
    def capture_batch(self, samples: Sequence[TokenizedSample]) -> list[CaptureResult]:
        """Capture one batch; results are in input order, one per sample."""

    def capture_stream(self, samples: Iterable[TokenizedSample], batch_size: int) -> Iterator[CaptureResult]:
        """Capture an iterable in batches of ``batch_size``; results may be yielded in any order."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        batch: list[TokenizedSample] = []
        for sample in samples:
            batch.append(sample)
            if len(batch) == batch_size:
                yield from self.capture_batch(batch)
                batch = []
        if batch:
            yield from self.capture_batch(batch)

    def close(self) -> None:
        """Release resources (servers, sessions, GPU memory)."""

    def __enter__(self) -> "CaptureBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

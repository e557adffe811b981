"""The two records that flow through the pipeline: tokens in, states out."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch

__all__ = ["MAX_SAMPLE_ID_CHARS", "CapturedSample", "TokenizedSample", "batches", "sample_id_problem"]

MAX_SAMPLE_ID_CHARS = 1024  # a shard header lists every id: a longer one is a malformed row, skipped and counted


def sample_id_problem(sid: object) -> str | None:
    """Why ``sid`` cannot be stored as a sample id (the one rule: the writer's, and the imports' for ids files carry), or None."""
    if isinstance(sid, str) and sid and len(sid) <= MAX_SAMPLE_ID_CHARS:
        return None
    shown = f"{sid[:80]!r}... ({len(sid)} chars)" if isinstance(sid, str) and len(sid) > 80 else repr(sid)[:120]
    return f"sample id must be a non-empty string of at most {MAX_SAMPLE_ID_CHARS} chars, got {shown}"


@dataclass(frozen=True)
class TokenizedSample:
    """A prompt ready for capture.

    ``sample_id`` must be stable across runs (derived from the source row), since
    resume skips ids that are already stored.
    """

    sample_id: str
    input_ids: torch.Tensor  # int64 [T]
    loss_mask: torch.Tensor  # bool [T]
    truncated: bool = False
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.input_ids.dtype != torch.int64 or self.input_ids.dim() != 1:
            raise ValueError(f"{self.sample_id}: input_ids must be int64 [T], got {self.input_ids.dtype} {tuple(self.input_ids.shape)}")
        if self.loss_mask.dtype != torch.bool or self.loss_mask.shape != self.input_ids.shape:
            raise ValueError(
                f"{self.sample_id}: loss_mask must be bool with the shape of input_ids {tuple(self.input_ids.shape)}, "
                f"got {self.loss_mask.dtype} {tuple(self.loss_mask.shape)}"
            )

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass
class CapturedSample:
    """One sample's tokens with its captured hidden states (see docs/FORMAT.md for meanings)."""

    sample_id: str
    input_ids: torch.Tensor  # int64 [T]
    loss_mask: torch.Tensor  # bool [T]
    aux_hidden_states: torch.Tensor  # [T, K, H]
    final_hidden_state: torch.Tensor  # [T, H]
    # Set when the server already encoded the states as fp8_e4m3_per_token (float8 data
    # above, one float32 scale per token and layer here), so the writer stores them as
    # they are instead of decoding and quantizing twice.
    aux_scale: torch.Tensor | None = None  # float32 [T, K]
    final_scale: torch.Tensor | None = None  # float32 [T]
    # How the states were captured, where a build can do it two ways (a regenerated conversation: "one_pass"
    # while generated, or "prefill" afterwards); recorded per sample in the shard header and counted per shard.
    capture_path: str | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


def batches(samples: Iterable[TokenizedSample], size: int) -> Iterator[list[TokenizedSample]]:
    """Consecutive windows of ``size`` samples in source order (the last one may be shorter)."""
    batch: list[TokenizedSample] = []
    for sample in samples:
        batch.append(sample)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def bursts(samples: Iterable[TokenizedSample], tokens: int, size: int) -> Iterator[TokenizedSample]:
    """The same samples, held back and let go in groups of at least ``tokens`` tokens or ``size`` samples.

    Finished regenerated conversations arrive one at a time; sent to a server so, each is
    prefilled alone and every decoding request there waits for it. Let go together, a
    group goes out at once and the server prefills it in one batch.
    """
    held: list[TokenizedSample] = []
    count = 0
    source = iter(samples)
    try:
        for sample in source:
            held.append(sample)
            count += sample.num_tokens
            if count >= tokens or len(held) >= size:
                yield from held
                held, count = [], 0
        yield from held
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()  # a stopped consumer stops the producer at once (the regeneration pump's threads)

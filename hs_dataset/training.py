"""EAGLE-3 training pairs straight from the shards, for plain PyTorch.

Pieces (all picklable, so ``DataLoader(num_workers>0)`` works under fork and spawn)::

    from torch.utils.data import DataLoader, DistributedSampler
    from hs_dataset.training import Eagle3Dataset, PackingBatchSampler, PackedCollator

    ds = Eagle3Dataset("out/kimi")                        # one shifted sample per item, zero-copy views
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    batches = PackingBatchSampler(sampler, ds.lengths, max_tokens=8192)
    loader = DataLoader(ds, batch_sampler=batches, collate_fn=PackedCollator(8192), num_workers=4)
    for epoch in range(E):
        batches.set_epoch(epoch)                          # forwards to the sampler
        for batch in loader: ...

or ``make_loader(path, max_tokens, rank=..., world_size=...)`` for the same wiring
(``packing=PackingOptions(...)`` for the oversize policy and the padding).

The shift (mirrors speculators' ``shift_batch``)
-----------------------------------------------
A stored sample has T tokens ``x_0..x_{T-1}`` with, per token ``t``, the aux states
``g_t`` ([K, H], the layers ``aux_layer_ids``), the final state ``y_t`` ([H], pre-norm
as stored) and the loss mask ``l_t``. Its training row has ``T-1`` positions; position
``j`` (``j = 0..T-2``) holds::

    input_ids[j]           = x_{j+1}      input_ids[1:]
    aux_hidden_states[j]   = g_j          aux_hidden_states[:-1]
    final_hidden_state[j]  = y_{j+1}      final_hidden_state[1:]   (final_alignment="next", default)
    loss_mask[j]           = l_{j+1}      loss_mask[1:]
    position_ids[j]        = j + 1        positions restart at 1 in every packed sample

i.e. the drafter's input at ``j`` is the target's hidden states at ``j`` together with
the *next* token ``x_{j+1}`` (whose embedding the drafter concatenates), exactly
speculators' ``(x1, g0, y1, l1)`` alignment: ``input_ids[1:]``, ``hidden_states[:-1]``,
``verifier_last_hidden_states[1:]``, ``loss_mask[1:]``, ``position_ids[1:]``, ``lengths - 1``.
``y_{j+1}`` is the target state at ``x_{j+1}``'s position, whose logits
(``lm_head(norm(y))``) are the target distribution of token ``x_{j+2}``, the token the
drafter predicts at ``j``. ``final_alignment="current"`` gives ``final_hidden_state[:-1]``
(``y_j``, aligned with ``g_j``) for trainers that shift the targets themselves.
A sample of one token has no pair and is skipped.

Packing
-------
:class:`PackingBatchSampler` groups the indices its sampler yields, in that order,
into packs whose shifted lengths sum to at most ``max_tokens``; a sample is never
split across packs. A sample longer than the budget is, by ``oversize``: ``"truncate"``
(default: alone in its pack, cut to its first ``max_tokens`` positions by the
collator, like speculators' ``max_len``), ``"drop"``, or ``"error"``. Wrapping any
sampler keeps its semantics: with ``DistributedSampler`` each rank packs its own
deterministic, disjoint share of samples (``set_epoch`` reshuffles). Ranks may end up
with a different number of packs (their samples differ in length); trainers that need
equal step counts should stop at the minimum over ranks or use ``Join``.

:class:`PackedCollator` turns a pack into one row (batch dimension 1)::

    input_ids           [1, L]        int64
    aux_hidden_states   [1, L, K, H]  stored dtype   (.flatten(-2) = speculators' "hidden_states" [1, L, K*H])
    final_hidden_state  [1, L, H]     stored dtype   (speculators' "verifier_last_hidden_states")
    loss_mask           [1, L]        bool
    position_ids        [1, L]        int64, restart per sample (see the shift)
    document_ids        [1, L]        int64, packed-sample index of every position, -1 on padding
    cu_seqlens          [n+1]         int32, flash-attention varlen boundaries: sample i is [cu[i], cu[i+1])
    lengths             [n]           int64
    max_seqlen          int
    num_tokens          int           real (unpadded) positions
    sample_ids          list[str]

``L`` is the sum of the lengths, or padded to ``pad_to_multiple_of`` / to ``max_tokens``
(``pad_to_max=True``); padding has ``loss_mask`` False, zero states, ``document_ids`` -1
and lies outside ``cu_seqlens``. Attention must not cross samples: use ``cu_seqlens``
(varlen kernels) or ``document_ids`` (block masks).

Copies: items are views of the memory-mapped shards (no copy; the fp8 encoding is
decoded, which allocates). The collator writes every pack into freshly allocated
tensors exactly once; inside a ``DataLoader`` worker it allocates them in shared
memory (as ``default_collate`` does), so handing the batch to the main process
copies nothing more.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch.utils.data import Sampler

from hs_dataset.formats.reader import HiddenStateDataset, open_dataset

__all__ = [
    "Eagle3Dataset",
    "PackedCollator",
    "PackingBatchSampler",
    "PackingOptions",
    "SeededShuffleSampler",
    "make_loader",
    "shift_sample",
]

_ALIGNMENTS = ("next", "current")
_OVERSIZE = ("truncate", "drop", "error")


def _check_oversize(oversize: str) -> None:
    if oversize not in _OVERSIZE:
        raise ValueError(f"oversize must be one of {_OVERSIZE}, got {oversize!r}")


def shift_sample(sample: dict[str, Any], *, final_alignment: str = "next") -> dict[str, Any]:
    """The training row of one stored sample, as zero-copy views (see the module doc)."""
    if final_alignment not in _ALIGNMENTS:
        raise ValueError(f"final_alignment must be one of {_ALIGNMENTS}, got {final_alignment!r}")
    final = sample["final_hidden_state"]
    return {
        "sample_id": sample["sample_id"],
        "input_ids": sample["input_ids"][1:],
        "aux_hidden_states": sample["aux_hidden_states"][:-1],
        "final_hidden_state": final[1:] if final_alignment == "next" else final[:-1],
        "loss_mask": sample["loss_mask"][1:],
    }


class Eagle3Dataset(torch.utils.data.Dataset):
    """Shifted training rows of a dataset directory, one per stored sample, in manifest order.

    Pickles as its path and options; every process maps the shards it touches.
    """

    def __init__(
        self, source: str | os.PathLike | HiddenStateDataset, *, final_alignment: str = "next", verify_hashes: bool = False
    ) -> None:
        if final_alignment not in _ALIGNMENTS:
            raise ValueError(f"final_alignment must be one of {_ALIGNMENTS}, got {final_alignment!r}")
        self.data = source if isinstance(source, HiddenStateDataset) else open_dataset(source, verify_hashes=verify_hashes)
        self.final_alignment = final_alignment
        self._lengths: list[int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"data": self.data, "final_alignment": self.final_alignment}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.data = state["data"]
        self.final_alignment = state["final_alignment"]
        self._lengths = None

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return shift_sample(self.data[index], final_alignment=self.final_alignment)

    @property
    def lengths(self) -> list[int]:
        """Shifted length (stored tokens - 1) of every sample, from the shard offsets (no state is read)."""
        if self._lengths is None:
            out: list[int] = []
            for shard_index in range(len(self.data.manifest.shards)):
                offsets = self.data.shard_offsets(shard_index)
                out.extend(int(n) - 1 for n in (offsets[1:] - offsets[:-1]).tolist())
            self._lengths = out
        return self._lengths

    @property
    def aux_layer_ids(self) -> list[int]:
        return list(self.data.manifest.aux_layer_ids)


class SeededShuffleSampler(Sampler[int]):
    """A permutation of ``range(n)`` fixed by (seed, epoch); iterating twice gives the same order."""

    def __init__(self, n: int, *, seed: int = 0, shuffle: bool = True) -> None:
        self.n, self.seed, self.shuffle, self.epoch = int(n), int(seed), shuffle, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        if not self.shuffle:
            return iter(range(self.n))
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self) -> int:
        return self.n


class PackingBatchSampler(Sampler[list[int]]):
    """Packs of sample indices whose shifted lengths sum to at most ``max_tokens``.

    ``sampler`` gives the order (and, for ``DistributedSampler``, this rank's share);
    indices are packed greedily in that order. ``lengths`` are
    :attr:`Eagle3Dataset.lengths`. Samples of length 0 (one stored token) are skipped.
    ``len()`` iterates the sampler once, so it is exact for deterministic samplers
    (``DistributedSampler``, :class:`SeededShuffleSampler`, ``SequentialSampler``).
    """

    def __init__(
        self,
        sampler: Sampler[int] | Iterable[int],
        lengths: Sequence[int],
        max_tokens: int,
        *,
        oversize: str = "truncate",
        drop_last: bool = False,
    ) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        _check_oversize(oversize)
        self.sampler = sampler
        self.lengths = lengths
        self.max_tokens = int(max_tokens)
        self.oversize = oversize
        self.drop_last = drop_last

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        pack: list[int] = []
        used = 0
        for index in self.sampler:
            n = int(self.lengths[index])
            if n <= 0:
                continue
            if n > self.max_tokens:
                if self.oversize == "drop":
                    continue
                if self.oversize == "error":
                    raise ValueError(f"sample {index} has {n} training positions, more than max_tokens={self.max_tokens}")
                n = self.max_tokens  # truncated by the collator; alone in its pack
            if pack and used + n > self.max_tokens:
                yield pack
                pack, used = [], 0
            pack.append(int(index))
            used += n
        if pack and not self.drop_last:
            yield pack

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _empty(shape: tuple[int, ...], dtype: torch.dtype, shared: bool) -> torch.Tensor:
    """A new tensor; in shared memory when collating inside a DataLoader worker (no copy on hand-off)."""
    if shared:
        numel = 1
        for d in shape:
            numel *= d
        proto = torch.empty(0, dtype=dtype)
        try:
            storage = proto._typed_storage()._new_shared(numel, device=proto.device)
            return proto.new(storage).view(shape)
        except (AttributeError, RuntimeError):  # private API moved: fall back to a normal allocation
            pass
    return torch.empty(shape, dtype=dtype)


class PackedCollator:
    """Collate a pack of shifted samples into one row (see the module doc for the fields).

    ``max_tokens`` (the packing budget) cuts an oversize sample, which the packing
    sampler always leaves alone in its pack; with ``None`` nothing is cut.
    """

    def __init__(self, max_tokens: int | None = None, *, pad_to_multiple_of: int | None = None, pad_to_max: bool = False) -> None:
        if pad_to_max and max_tokens is None:
            raise ValueError("pad_to_max needs max_tokens")
        self.max_tokens = max_tokens
        self.pad_to_multiple_of = pad_to_multiple_of
        self.pad_to_max = pad_to_max

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        items = [it for it in items if it["input_ids"].shape[0] > 0]
        if not items:
            raise ValueError("a pack needs at least one sample with two or more tokens")
        lengths: list[int] = []
        budget = self.max_tokens
        for it in items:
            n = int(it["input_ids"].shape[0])
            if budget is not None:
                n = min(n, budget - sum(lengths))
                if n <= 0:
                    raise ValueError(
                        f"pack of {len(items)} samples exceeds max_tokens={self.max_tokens}; use PackingBatchSampler with the same budget"
                    )
            lengths.append(n)
        total = sum(lengths)
        padded = total
        if self.pad_to_max:
            padded = int(self.max_tokens)
        elif self.pad_to_multiple_of:
            m = int(self.pad_to_multiple_of)
            padded = -(-total // m) * m
        first = items[0]
        aux0, fin0 = first["aux_hidden_states"], first["final_hidden_state"]
        shared = torch.utils.data.get_worker_info() is not None
        out = {
            "input_ids": _empty((1, padded), torch.int64, shared),
            "aux_hidden_states": _empty((1, padded, *aux0.shape[1:]), aux0.dtype, shared),
            "final_hidden_state": _empty((1, padded, *fin0.shape[1:]), fin0.dtype, shared),
            "loss_mask": _empty((1, padded), torch.bool, shared),
            "position_ids": _empty((1, padded), torch.int64, shared),
            "document_ids": _empty((1, padded), torch.int64, shared),
        }
        begin = 0
        for doc, (it, n) in enumerate(zip(items, lengths)):
            end = begin + n
            for key in ("input_ids", "aux_hidden_states", "final_hidden_state", "loss_mask"):
                src = it[key]
                if src.shape[1:] != out[key].shape[2:] or src.dtype != out[key].dtype:
                    raise ValueError(
                        f"sample {it['sample_id']!r}: {key} is {tuple(src.shape)} {src.dtype}, the pack's first sample has {tuple(out[key].shape[2:])} {out[key].dtype}"
                    )
                out[key][0, begin:end].copy_(src[:n])
            out["position_ids"][0, begin:end].copy_(torch.arange(1, n + 1))
            out["document_ids"][0, begin:end] = doc
            begin = end
        if padded > total:
            out["input_ids"][0, total:] = 0
            out["aux_hidden_states"][0, total:] = 0
            out["final_hidden_state"][0, total:] = 0
            out["loss_mask"][0, total:] = False
            out["position_ids"][0, total:] = 0
            out["document_ids"][0, total:] = -1
        cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
        cu[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0).to(torch.int32)
        out["cu_seqlens"] = cu
        out["lengths"] = torch.tensor(lengths, dtype=torch.int64)
        out["max_seqlen"] = max(lengths)
        out["num_tokens"] = total
        out["sample_ids"] = [it["sample_id"] for it in items]
        return out


@dataclass(frozen=True, kw_only=True)
class PackingOptions:
    """How :func:`make_loader` packs: ``oversize`` (``"truncate"``, ``"drop"`` or ``"error"``, see
    :class:`PackingBatchSampler`) and the padding of :class:`PackedCollator` (``pad_to_multiple_of``, ``pad_to_max``)."""

    oversize: str = "truncate"
    pad_to_multiple_of: int | None = None
    pad_to_max: bool = False

    def __post_init__(self) -> None:
        _check_oversize(self.oversize)


_PACKING_FIELDS = tuple(f.name for f in fields(PackingOptions))


def make_loader(
    path: str | os.PathLike | HiddenStateDataset,
    max_tokens: int,
    *,
    shuffle: bool = True,
    seed: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
    num_workers: int = 0,
    final_alignment: str = "next",
    packing: PackingOptions = PackingOptions(),
    **loader_kwargs: Any,
) -> torch.utils.data.DataLoader:
    """A ``DataLoader`` of packed EAGLE-3 rows; ``loader.batch_sampler.set_epoch(e)`` reshuffles.

    ``rank``/``world_size`` default to ``torch.distributed``'s when it is initialized;
    with more than one rank each gets a ``DistributedSampler`` share (seeded, disjoint;
    ``DistributedSampler`` repeats a few samples so that every rank gets the same count).
    ``loader_kwargs`` go to the ``DataLoader``.
    """
    misplaced = [k for k in loader_kwargs if k in _PACKING_FIELDS]
    if misplaced:
        raise TypeError(f"make_loader: {misplaced[0]} is a packing option; pass packing=PackingOptions({misplaced[0]}=...)")
    dataset = Eagle3Dataset(path, final_alignment=final_alignment)
    if world_size is None and torch.distributed.is_available() and torch.distributed.is_initialized():
        world_size = torch.distributed.get_world_size()
        rank = torch.distributed.get_rank() if rank is None else rank
    if world_size is not None and world_size > 1:
        from torch.utils.data import DistributedSampler

        sampler: Sampler[int] = DistributedSampler(dataset, num_replicas=world_size, rank=rank or 0, shuffle=shuffle, seed=seed)
    else:
        sampler = SeededShuffleSampler(len(dataset), seed=seed, shuffle=shuffle)
    batches = PackingBatchSampler(sampler, dataset.lengths, max_tokens, oversize=packing.oversize)
    collate = PackedCollator(max_tokens, pad_to_multiple_of=packing.pad_to_multiple_of, pad_to_max=packing.pad_to_max)
    return torch.utils.data.DataLoader(dataset, batch_sampler=batches, collate_fn=collate, num_workers=num_workers, **loader_kwargs)

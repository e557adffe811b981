"""The states of one forward pass: checked into one layout, and quantized for fp8 storage.

Runs inside SGLang scheduler processes (stdlib and torch only). The glue hands over
the aux states as SGLang made them -- ``[N, K*H]`` packed, ``[N, K, H]``, or ``K``
tensors ``[N, H]`` -- and the pre-norm final state ``[N, H]``;
:func:`normalize_states` turns them into ``[N, K, H]`` + ``[N, H]`` views (no copy
where SGLang packed them) or says, as :class:`UnusableStates`, why they cannot be
used. :func:`pass_states` then quantizes the whole pass at once where the card stores
fp8 or 4-bit states, so each request's rows are plain slices of the result.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from hs_dataset.codecs.registry import ENCODINGS
from hs_dataset.errors import HsDatasetError

__all__ = ["UnusableStates", "normalize_states", "pass_states", "prepare_quantizer"]


class UnusableStates(HsDatasetError):
    """The pass's states cannot be stored; the message is the refusal reason of every request of ours in it.

    Caught by the capture core, which refuses those requests: it never reaches SGLang.
    """


def normalize_states(
    aux: torch.Tensor | Sequence[torch.Tensor] | None,
    final: torch.Tensor | None,
    layer_ids: Sequence[int],
    total_rows: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(aux [N, K, H], final [N, H])`` for the ``K = len(layer_ids)`` configured layers, or :class:`UnusableStates`."""
    k = len(layer_ids)
    if final is None:
        raise UnusableStates("no pre-norm final state was captured for this pass")
    if aux is None:
        raise UnusableStates("no aux hidden states were captured for this pass (is aux capture enabled on the server?)")
    if final.dim() != 2:
        raise UnusableStates(f"pre-norm final state has shape {tuple(final.shape)}, expected [tokens, hidden]")
    h = final.shape[1]
    if isinstance(aux, (list, tuple)):
        if len(aux) != k:
            raise UnusableStates(f"captured {len(aux)} aux layers, configured {k} ({list(layer_ids)})")
        aux = torch.stack([a.reshape(a.shape[0], -1) for a in aux], dim=1)
    if aux.dim() == 2:
        if aux.shape[1] != k * h:
            raise UnusableStates(
                f"aux hidden states are {aux.shape[1]} wide, expected {k} layers x {h} = {k * h}: the server "
                f"captures a different number of layers than configured ({list(layer_ids)})"
            )
        aux = aux.view(aux.shape[0], k, h)
    if aux.dim() != 3 or aux.shape[1] != k or aux.shape[2] != h:
        raise UnusableStates(f"aux hidden states have shape {tuple(aux.shape)}, expected [tokens, {k}, {h}]")
    if aux.shape[0] < total_rows or final.shape[0] < total_rows:
        raise UnusableStates(
            f"states cover {min(aux.shape[0], final.shape[0])} tokens but the batch extends {total_rows}: "
            "the states are token-scattered across ranks (DP-attention / sequence-parallel layouts are not supported)"
        )
    return aux, final


# The registry's device quantizer of every encoding that has one (the 4-bit ones fused on a CUDA device, the host's bytes).
QUANTIZERS = {e.name: e.device_quantizer() for e in ENCODINGS.values() if e.device_quantizer is not None}


def pass_states(
    aux: torch.Tensor, final: torch.Tensor, total_rows: int, encoding: str | None, *, aux_owned: bool = False
) -> tuple[dict[str, torch.Tensor], tuple[str, ...]]:
    """The tensors each request's rows are sliced from, and the names of those nothing else writes (``owned``: no snapshot needed).

    With an ``encoding`` (fp8, or a 4-bit one), one quantization for the whole pass, on
    the device: per-token (fp8) or per-group-of-32 (4-bit) scales make it row-wise, so
    each request's rows of the result are its own encoding. ``aux_owned``: the glue
    made ``aux`` for this capture.
    """
    if encoding is None:
        return {"aux": aux, "final": final}, ("aux",) if aux_owned else ()
    quantize = QUANTIZERS[encoding]
    aux_q, aux_s = quantize(aux[:total_rows])
    final_q, final_s = quantize(final[:total_rows])
    states = {"aux": aux_q, "aux_scale": aux_s, "final": final_q, "final_scale": final_s}
    return states, tuple(states)


def prepare_quantizer(encoding: str | None, device: torch.device | str) -> float:
    """Run the pass quantizer once on ``device`` (server start); seconds it took.

    Why: the fused 4-bit kernel is compiled on its first call, and a first call in the
    first forward pass stalls that pass, which shows in the prefill overhead of the
    first phase (docs/BENCHMARKS.md: the node path with nf4 states,
    ``benchmarks/bench_node.py``). Triton compiles one variant for group counts
    divisible by 16 and one for the rest; both are made here.
    """
    started = time.monotonic()
    if encoding is not None:
        for rows in (16, 3):
            QUANTIZERS[encoding](torch.zeros(rows, 32, dtype=torch.bfloat16, device=device))
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
    return time.monotonic() - started

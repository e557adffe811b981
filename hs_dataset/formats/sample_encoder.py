"""A captured sample checked against the dataset's layout and put in storage form.

Every check runs before anything is written, so a bad sample raises a
:class:`~hs_dataset.errors.SampleError` naming it and the dataset is untouched. The
NaN/inf check is reported separately: whether such a sample is quarantined or refused
is the writer's policy (``nonfinite``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hs_dataset.codecs.registry import Encoding
from hs_dataset.errors import NonFiniteStateError, SampleError
from hs_dataset.formats.encoding import BadScaleError, accept_encoded_state, all_finite, encode_state
from hs_dataset.formats.shard_file import EncodedSample
from hs_dataset.sample import CapturedSample

__all__ = ["SampleEncoder", "on_host"]


def on_host(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` on the host without autograd, with no call into torch when it already is.

    Why: even a no-op torch call (``detach``, ``to``) hands the GIL back, and ``add``
    runs on one thread that shares the GIL with the client's loaders and writer
    threads, where each hand-back can wait a switch interval (``bench_node.py --trace``
    shows that thread's time).
    """
    if t is None or (t.device.type == "cpu" and not t.requires_grad):
        return t
    return t.detach().to("cpu")


@dataclass(frozen=True)
class SampleEncoder:
    """The layout every sample of one dataset must have, and the encoding its states are stored in."""

    state_dtype: torch.dtype
    num_aux: int
    hidden_size: int
    encoding: Encoding

    def check(self, s: CapturedSample) -> None:
        """Refuse a sample whose tensors, shapes or dtypes do not fit the dataset (:class:`SampleError`)."""
        sid = s.sample_id
        ids, mask, aux, final = s.input_ids, s.loss_mask, s.aux_hidden_states, s.final_hidden_state
        if not all(isinstance(t, torch.Tensor) for t in (ids, mask, aux, final)):
            raise SampleError(f"{sid}: input_ids, loss_mask and both states must be torch tensors")
        if ids.dim() != 1 or ids.shape[0] == 0:
            raise SampleError(f"{sid}: empty sample or input_ids not 1-D (shape {tuple(ids.shape)}); every sample needs >= 1 token")
        if ids.dtype not in (torch.int64, torch.int32):
            raise SampleError(f"{sid}: input_ids must be int64, got {ids.dtype}")
        t = ids.shape[0]
        if mask.shape != (t,) or mask.dtype not in (torch.bool, torch.uint8, torch.int64, torch.int32):
            raise SampleError(f"{sid}: loss_mask must be bool [{t}], got {mask.dtype} {tuple(mask.shape)}")
        if mask.dtype != torch.bool and bool(((mask != 0) & (mask != 1)).any()):
            raise SampleError(f"{sid}: loss_mask must hold only 0/1")
        # states the server already encoded are in storage form (packed codes: [..., H / pack])
        shape_of = self.encoding.stored_shape if _pre_encoded(s) else tuple
        want_aux, want_final = shape_of((t, self.num_aux, self.hidden_size)), shape_of((t, self.hidden_size))
        if tuple(aux.shape) != want_aux:
            raise SampleError(f"{sid}: aux_hidden_states shape {tuple(aux.shape)} != expected {want_aux} [tokens, K, H]")
        if tuple(final.shape) != want_final:
            raise SampleError(f"{sid}: final_hidden_state shape {tuple(final.shape)} != expected {want_final} [tokens, H]")
        for name, state in (("aux_hidden_states", aux), ("final_hidden_state", final)):
            if state.dtype != self.state_dtype and not _pre_encoded(s):
                raise SampleError(f"{sid}: {name} dtype {state.dtype} != dataset dtype {self.state_dtype}; capture in one dtype")

    @staticmethod
    def nonfinite_problem(s: CapturedSample) -> str:
        """Where the states hold NaN/inf, in words; empty when they are finite."""
        problems = []
        for name, state in (("aux_hidden_states", s.aux_hidden_states), ("final_hidden_state", s.final_hidden_state)):
            if all_finite(state):
                continue
            finite = torch.isfinite(state.float() if state.dtype == torch.float8_e4m3fn else state)
            bad_tokens = (~finite).flatten(1).any(dim=1).nonzero().flatten()
            problems.append(f"{name} has NaN/inf at {bad_tokens.numel()} token(s), first at token {int(bad_tokens[0])}")
        return "; ".join(problems)

    def encode(self, s: CapturedSample) -> EncodedSample:
        """The checked sample in storage form, on the host; states from the server's GPU quantizer are kept as encoded.

        Raises :class:`NonFiniteStateError` for pre-encoded states whose scales cannot decode
        (one NaN scale of a 4-bit group), :class:`SampleError` for anything else wrong with them.
        """
        sid = s.sample_id
        aux, final = s.aux_hidden_states, s.final_hidden_state
        if _pre_encoded(s):  # stored as the server encoded them (the same quantizer), after checks
            try:
                aux_data, aux_scale = accept_encoded_state(on_host(aux), on_host(s.aux_scale), self.encoding, f"{sid}: aux_hidden_states")
                final_data, final_scale = accept_encoded_state(
                    on_host(final), on_host(s.final_scale), self.encoding, f"{sid}: final_hidden_state"
                )
            except BadScaleError as exc:  # non-finite once decoded: the writer's nonfinite policy decides, as for NaN states
                raise NonFiniteStateError(str(exc)) from None
            except ValueError as exc:
                raise SampleError(str(exc)) from None
        else:
            aux_data, aux_scale = encode_state(on_host(aux), self.encoding)
            final_data, final_scale = encode_state(on_host(final), self.encoding)
        ids, mask = on_host(s.input_ids), on_host(s.loss_mask)
        return EncodedSample(
            sid,
            (ids if ids.dtype == torch.int64 else ids.to(torch.int64)).contiguous(),
            (mask if mask.dtype == torch.bool else mask.bool()).contiguous(),
            aux_data,
            aux_scale,
            final_data,
            final_scale,
            s.capture_path,
        )


def _pre_encoded(s: CapturedSample) -> bool:
    """States encoded on the server's GPU come with their scales."""
    return s.aux_scale is not None or s.final_scale is not None

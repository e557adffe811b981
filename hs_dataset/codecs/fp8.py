"""The ``fp8_e4m3_per_token`` state encoding: its name, its scale tensors and the one quantizer.

With fp8 staging (dump metadata ``state_encoding`` = ``fp8_e4m3_per_token``) both states
are float8 e4m3 and two more tensors hold their float32 per-token scales,
``aux_hidden_states.scale`` ``[T, K]`` and ``final_hidden_state.scale`` ``[T]``; the
``dtype`` key still names the model dtype the states decode to. Without the key (or
``native``) the states are the model dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported lazily: this module stays importable with the stdlib alone
    import torch

__all__ = [
    "FP8_ENCODING",
    "FP8_MAX",
    "SCALE_SUFFIX",
    "STATE_ENCODING_KEY",
    "bad_scales",
    "dequantize_fp8_per_token",
    "quantize_fp8_per_token",
]

STATE_ENCODING_KEY = "state_encoding"  # dump metadata key; absent or "native" = model dtype
FP8_ENCODING = "fp8_e4m3_per_token"
FP8_MAX = 448.0  # largest finite float8_e4m3fn
SCALE_SUFFIX = ".scale"


def quantize_fp8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., H]`` -> (float8_e4m3fn data ``[..., H]``, float32 scale ``[...]``), on x's device.

    The one implementation of the ``fp8_e4m3_per_token`` encoding: the server runs it
    on the GPU before the device-to-host copy (half the PCIe and staging bytes of
    bf16) and ``formats.encoding.encode_state`` runs it on the host, so a dataset's
    bytes do not depend on where the states were quantized (every step is IEEE
    exact or correctly rounded on both). It lives with the codecs because both
    sides run it, and the server side imports nothing else of hs_dataset.
    """
    import torch

    # max |x| per token, exactly, in one read of x (abs then amax of a float32 copy read
    # and wrote the states three more times: on the GPU the quantizer is memory-bound)
    low, high = torch.aminmax(x, dim=-1)
    amax = torch.maximum(-low, high).float()
    # amax / a tensor, not / a Python number: CUDA turns division by a scalar into a
    # multiplication by its reciprocal, which differs in the last bit from the host's
    # division; tensor / tensor is IEEE division on both.
    scale = torch.where(amax > 0, amax / torch.full_like(amax, FP8_MAX), torch.ones_like(amax))
    # x / scale promotes to float32 inside the one kernel (x's values are exact there)
    data = torch.div(x, scale.unsqueeze(-1)).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return data.contiguous(), scale.contiguous()


def dequantize_fp8_per_token(data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`quantize_fp8_per_token`, back to ``dtype``."""
    return (data.float() * scale.unsqueeze(-1)).to(dtype)


def bad_scales(scale: torch.Tensor) -> torch.Tensor:
    """Mask of the scales that cannot decode: not > 0, or not finite once multiplied by :data:`FP8_MAX`."""
    import torch

    return ~(torch.isfinite(scale * FP8_MAX) & (scale > 0))

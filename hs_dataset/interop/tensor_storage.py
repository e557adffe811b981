"""Whether a tensor ``torch.load`` handed back is backed by bytes of its own: checked before it is copied.

``torch.save`` records a tensor as (storage, offset, shape, strides). A hostile file can
declare a huge shape over a 4-byte storage with zero strides (``torch.zeros(1).expand(...)``
saves as a 1.3 kB file): loading it (mmap'd) costs nothing, but ``.contiguous()`` or any
copy materialises every declared element, gigabytes from kilobytes. A tensor whose
elements do not each have their own bytes in its storage (zero strides, overlapping
strides, or a storage too short for the shape) is refused here, by name, so that a copy
of an accepted tensor never costs more memory than the file it came from.
"""

from __future__ import annotations

import torch

from hs_dataset.errors import HsDatasetError

__all__ = ["SharedStorageError", "check_own_storage"]


class SharedStorageError(HsDatasetError, ValueError):
    """A loaded tensor's elements share bytes (zero or overlapping strides) or reach past its storage."""


def _overlaps(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether two indexes of ``shape`` reach one element: some stride does not step past the dims below it."""
    reach = 0  # the furthest element the dims with smaller strides reach
    for stride, size in sorted((st, sz) for st, sz in zip(strides, shape, strict=True) if sz > 1):
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def check_own_storage(tensor: torch.Tensor, *, where: str, name: str) -> None:
    """Refuse ``tensor`` (``name`` in file ``where``) unless each element has its own bytes inside its storage."""
    shape, strides = tuple(int(s) for s in tensor.shape), tuple(int(s) for s in tensor.stride())
    if tensor.numel() == 0:
        return
    itemsize = tensor.element_size()
    storage_bytes = tensor.untyped_storage().nbytes()
    if any(s < 0 for s in strides) or _overlaps(shape, strides):
        raise SharedStorageError(
            f"{where}: tensor {name} declares shape {list(shape)} with strides {list(strides)} over a {storage_bytes}-byte storage "
            "(elements share bytes: a zero-stride or overlapping tensor, not data); re-save it with .contiguous() or remove the file"
        )
    last = int(tensor.storage_offset()) + sum((size - 1) * stride for size, stride in zip(shape, strides, strict=True))
    if (last + 1) * itemsize > storage_bytes:
        raise SharedStorageError(
            f"{where}: tensor {name} declares shape {list(shape)} needing {(last + 1) * itemsize} bytes but its storage holds "
            f"{storage_bytes}; the file is damaged: re-save it or remove it"
        )

"""A loaded tensor must own its bytes before it is copied: zero strides, overlaps and short storages are refused."""

from __future__ import annotations

import pytest
import torch

from hs_dataset.interop.tensor_storage import SharedStorageError, check_own_storage


def test_zero_stride_tensor_is_refused_naming_file_tensor_shape_and_storage():
    tensor = torch.zeros(1).expand(2_000_000, 3, 64)
    with pytest.raises(SharedStorageError) as caught:
        check_own_storage(tensor, where="/d/data_0.ckpt", name="aux_hidden_state")
    assert str(caught.value) == (
        "/d/data_0.ckpt: tensor aux_hidden_state declares shape [2000000, 3, 64] with strides [0, 0, 0] over a 4-byte storage "
        "(elements share bytes: a zero-stride or overlapping tensor, not data); re-save it with .contiguous() or remove the file"
    )


def test_overlapping_strides_are_refused():
    base = torch.zeros(101)
    with pytest.raises(SharedStorageError, match=r"declares shape \[100, 2\] with strides \[1, 1\]"):
        check_own_storage(base.as_strided((100, 2), (1, 1)), where="f", name="t")


def test_storage_shorter_than_the_shape_is_refused():
    """torch builds no such view itself, but a loader's storage is the file's: the check does not trust it."""

    class ShortStorage:  # a tensor's answers, over a storage one element short
        shape, dtype = (4, 5), torch.float32

        def stride(self) -> tuple[int, int]:
            return (5, 1)

        def numel(self) -> int:
            return 20

        def element_size(self) -> int:
            return 4

        def storage_offset(self) -> int:
            return 1

        def untyped_storage(self) -> torch.UntypedStorage:
            return torch.zeros(20).untyped_storage()

    with pytest.raises(SharedStorageError, match=r"^f: tensor t declares shape \[4, 5\] needing 84 bytes but its storage holds 80;"):
        check_own_storage(ShortStorage(), where="f", name="t")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "tensor",
    [
        torch.zeros(4, 5),
        torch.zeros(4, 5).t(),
        torch.zeros(3, 4, 5)[1],
        torch.zeros(10)[2:7],
        torch.zeros(1).expand(1, 1),
        torch.zeros(0, 3),
    ],
    ids=["contiguous", "transposed", "slice", "offset", "size-one-dims", "empty"],
)
def test_tensors_with_their_own_bytes_pass(tensor):
    check_own_storage(tensor, where="f", name="t")

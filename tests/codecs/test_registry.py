"""The codec registry is the one list of encodings: every consumer's names and quantizers derive from it."""

from __future__ import annotations

import re
import typing

import pytest
import torch

from hs_dataset.codecs import registry
from hs_dataset.codecs.registry import ENCODINGS, STORAGE_CHOICES, STORAGE_NAMES, get_encoding, state_encoding_for
from hs_dataset.config.sections import ShardsSection, StorageName
from hs_dataset.errors import UnsupportedFormatError
from hs_dataset.server_patch.config import CaptureConfig
from hs_dataset.server_patch.states import QUANTIZERS
from tests.fixtures.paths import REPO


def test_every_storage_list_is_the_registry_s():
    scaled = {e.name for e in ENCODINGS.values() if e.scaled}
    assert set(STORAGE_NAMES.values()) == scaled and set(QUANTIZERS) == scaled
    assert set(typing.get_args(StorageName)) == {"native", *STORAGE_NAMES, *scaled} == set(CaptureConfig.STORAGES)
    assert ("native", *STORAGE_NAMES) == STORAGE_CHOICES
    for short, name in STORAGE_NAMES.items():  # the card schema's text names each one
        assert (
            f"`{short}`" in ShardsSection.model_fields["storage"].description and name in ShardsSection.model_fields["storage"].description
        )


def test_no_second_list_of_encoding_names_in_the_package():
    """An encoding's names are spelled in codecs/ alone (prose in comments aside)."""
    names = [*STORAGE_NAMES, *STORAGE_NAMES.values()]
    found = []
    for path in (REPO / "hs_dataset").rglob("*.py"):
        if path.parent.name == "codecs":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if any(re.search(rf"""["']{re.escape(n)}["']""", code) for n in names):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, found


@pytest.mark.parametrize("name", [e.name for e in ENCODINGS.values() if e.scaled])
def test_each_scaled_entry_round_trips_and_names_its_bytes(name):
    encoding = get_encoding(name)
    x = torch.randn(7, 3, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    data, scale = encoding.quantize(x)
    assert tuple(data.shape) == encoding.stored_shape(tuple(x.shape)) and tuple(scale.shape) == encoding.scale_shape(tuple(x.shape))
    assert data.dtype == encoding.storage_torch_dtype and scale.dtype == encoding.scale_torch_dtype
    back = encoding.dequantize(data, scale, torch.bfloat16)
    assert back.shape == x.shape and (back.float() - x.float()).abs().max() < 0.5 * x.float().abs().max()
    assert not encoding.bad_scales(scale).any() and encoding.scale_rule
    assert data.numel() * data.element_size() + scale.numel() * scale.element_size() == 7 * 3 * encoding.row_bytes(256)
    assert 0 < encoding.bytes_per_value(7168) < get_encoding("bf16").bytes_per_value(7168)
    device, _ = registry.device_quantizer(name)(x)  # on the CPU the device quantizer is the reference: same bytes
    assert torch.equal(device, data)


def test_storage_lookups_and_refusals():
    assert state_encoding_for(torch.bfloat16) == "bf16" and state_encoding_for(torch.float32, "native") == "f32"
    for short, name in STORAGE_NAMES.items():
        assert state_encoding_for(torch.bfloat16, short) == name == state_encoding_for(torch.bfloat16, name)
    with pytest.raises(ValueError, match="unknown storage"):
        state_encoding_for(torch.bfloat16, "int3")
    with pytest.raises(ValueError, match="hidden states must be"):
        state_encoding_for(torch.int64)
    with pytest.raises(UnsupportedFormatError, match="newer hs_dataset"):
        get_encoding("int3_g7")
    with pytest.raises(ValueError, match="plain encoding"):
        registry.device_quantizer("bf16")

"""What the capture-backend interface answers for a backend that only captures: no generator, no bursts."""

from __future__ import annotations

import pytest

from hs_dataset.capture.base import CaptureBackend
from hs_dataset.config import load_card
from hs_dataset.errors import UsageError


class CaptureOnly(CaptureBackend):
    def info(self):
        raise NotImplementedError

    def capture_batch(self, samples):
        return []


def test_a_backend_without_a_generator_refuses_regeneration_by_name():
    with pytest.raises(UsageError, match="--regenerate needs the hf or sglang backend; CaptureOnly cannot generate"):
        CaptureOnly().generator(load_card("tiny-deepseek-hf").regenerate, tokenizer=None)


def test_a_backend_captures_regenerated_conversations_without_bursts_by_default():
    assert CaptureOnly().capture_burst(8) is None

"""``hf:`` sources without a network: one line in seconds, not minutes of retries."""

from __future__ import annotations

import time

import pytest

from hs_dataset.errors import SourceError
from hs_dataset.sources.hub import load_hub_rows


def test_an_unreachable_hub_is_one_line_in_seconds(monkeypatch):
    import datasets
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", False)

    def never(*args, **kwargs):
        raise AssertionError("datasets.load_dataset was asked although the Hub does not answer")

    monkeypatch.setattr(datasets, "load_dataset", never)
    started = time.monotonic()
    with pytest.raises(SourceError) as caught:
        load_hub_rows("org/chats", split="train_sft")
    message = str(caught.value)
    assert time.monotonic() - started < 10
    assert "\n" not in message and message.startswith("hf:org/chats (subset None, split 'train_sft', revision 'main') cannot be loaded")
    assert "http://127.0.0.1:9" in message and "HF_HUB_OFFLINE=1" in message


def test_offline_mode_asks_the_local_cache_without_probing(monkeypatch):
    import datasets
    from huggingface_hub import constants

    import hs_dataset.sources.hub as hub

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub, "_unreachable", lambda: pytest.fail("probed the Hub in offline mode"))
    asked = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: asked.append(k["streaming"]) or ["row"])
    assert load_hub_rows("org/chats") == ["row"] and asked == [False]

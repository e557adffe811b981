"""The Hugging Face Hub: push a dataset (index, shards, manifest, card) and read it back."""

from __future__ import annotations

from typing import Any

__all__ = ["push_to_hub", "download_pushed", "open_pushed", "PushReport"]


def __getattr__(name: str) -> Any:  # lazy: huggingface_hub loads only when used
    if name in __all__:
        from hs_dataset.hub import push

        return getattr(push, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

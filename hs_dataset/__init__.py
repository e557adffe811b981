"""hs_dataset: EAGLE-3 drafter training data from a served LLM's hidden states.

Reading: ``hs_dataset.open_dataset(path)`` (a directory, or an fsspec URL such as
``s3://bucket/ds`` read through a bounded local cache: docs/REMOTE.md). Online from a live SGLang server into
training, with a bounded cache: ``hs_dataset.stream(card, source, server=URL, cache_dir=DIR,
max_cache_bytes=N)``. Building: ``hs-dataset build``, ``hs_dataset.build_dataset(hs_dataset.load_card(NAME), DIR)``,
``datasets.load_dataset("hs_dataset", config=...)`` (the name is taught to
``datasets`` at interpreter start by a one-line ``.pth`` hook the package installs,
:mod:`hs_dataset.datasets_hook`; see docs/DATASETS.md), or ``hs_dataset.load_dataset(...)``.

Importing the package does nothing else: attributes are imported lazily, so the SGLang
server can import ``hs_dataset.server_patch`` with nothing but torch installed.
"""

from __future__ import annotations

import importlib
from typing import Any

from hs_dataset.version import __version__

__all__ = ["HiddenStateDataset", "__version__", "build_dataset", "load_card", "load_dataset", "open_dataset", "push_to_hub", "stream"]

_LAZY = {
    "open_dataset": "hs_dataset.dataset_access",
    "HiddenStateDataset": "hs_dataset.formats.reader",
    "load_dataset": "hs_dataset.builder",
    "load_card": "hs_dataset.config",
    "build_dataset": "hs_dataset.pipeline.build",
    "push_to_hub": "hs_dataset.hub.upload",
    "stream": "hs_dataset.streaming.stream",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hs_dataset' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

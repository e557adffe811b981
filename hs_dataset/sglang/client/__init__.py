"""The SGLang client: requests, dump collection and validation against the dump contract."""

from __future__ import annotations

from hs_dataset.sglang.client.backend import SGLangBackend
from hs_dataset.sglang.client.endpoints import Endpoint

__all__ = ["SGLangBackend", "Endpoint"]

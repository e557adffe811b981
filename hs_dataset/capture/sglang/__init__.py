"""The SGLang client: requests, dump collection and validation against the dump contract."""

from __future__ import annotations

from hs_dataset.capture.sglang.backend import SGLangBackend
from hs_dataset.capture.sglang.endpoints import Endpoint

__all__ = ["Endpoint", "SGLangBackend"]

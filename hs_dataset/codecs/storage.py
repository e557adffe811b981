"""The storage names a card may give (``shards.storage``) and the state encoding each stands for.

One table for the shard writer (``formats/encoding.py``), ``hs-dataset serve`` (which
tells the server) and the server's capture core (which quantizes on the device), so a
new encoding is named in one place. stdlib only, like the rest of ``wire/``.
"""

from __future__ import annotations

from hs_dataset.codecs.fp4 import MXFP4_ENCODING, NF4_ENCODING
from hs_dataset.codecs.fp8 import FP8_ENCODING

__all__ = ["STORAGE_NAMES", "ENCODED_STORAGES", "encoding_of_storage"]

STORAGE_NAMES: dict[str, str] = {"fp8": FP8_ENCODING, "mxfp4": MXFP4_ENCODING, "nf4": NF4_ENCODING}  # short name -> encoding
ENCODED_STORAGES: tuple[str, ...] = (*STORAGE_NAMES, *STORAGE_NAMES.values())  # every name that stores quantized states


def encoding_of_storage(storage: str) -> str | None:
    """The encoding a storage name (short or full) stands for; ``None`` for ``native`` or a name this table lacks."""
    return STORAGE_NAMES.get(storage, storage if storage in STORAGE_NAMES.values() else None)

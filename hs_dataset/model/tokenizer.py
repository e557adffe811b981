"""The one tokenizer loader: a local snapshot's tokenizer, its remote code only when allowed."""

from __future__ import annotations

import os
from typing import Any

from hs_dataset.model.remote_code import check_remote_code

__all__ = ["load_tokenizer"]


def load_tokenizer(directory: str | os.PathLike, *, trust_remote_code: bool = False) -> Any:
    """``AutoTokenizer`` for a local snapshot, refusing remote code that was not asked for."""
    from transformers import AutoTokenizer

    check_remote_code(directory, trust_remote_code, ("tokenizer_config.json",))
    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=trust_remote_code)

"""The one tokenizer loader: a local snapshot's tokenizer, its remote code only when allowed.

:func:`load_card_tokenizer` is what a run uses: the card's remote-code permission and
chat template applied, one shared object per unchanged snapshot. :func:`tokenizer_info`
is what the manifest records about it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from hs_dataset.config import Card
from hs_dataset.errors import UsageError
from hs_dataset.model.remote_code import check_remote_code

__all__ = ["load_card_tokenizer", "load_tokenizer", "tokenizer_info"]

_TOKENIZERS: dict[tuple, Any] = {}


def load_tokenizer(directory: str | os.PathLike, *, trust_remote_code: bool = False) -> Any:
    """``AutoTokenizer`` for a local snapshot, refusing remote code that was not asked for."""
    from transformers import AutoTokenizer

    check_remote_code(directory, trust_remote_code, ("tokenizer_config.json",))
    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=trust_remote_code)


def _files_signature(directory: Path) -> tuple:
    """Names, sizes and mtimes of a snapshot's top-level files: a changed tokenizer file is a new key."""
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
        return tuple((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in entries if e.is_file())
    except OSError:
        return ()


def load_card_tokenizer(card: Card, directory: Path) -> Any:
    """The snapshot's tokenizer (remote code only if the card allows it), with the card's chat template if it names one.

    Loading a large vocabulary is slow; builds in one process (datasets parts, streams,
    benchmarks) share one tokenizer per unchanged snapshot. One with a card template
    override is loaded fresh, since the override changes the object.
    """
    if not card.model.chat_template:
        key = (str(directory), card.model.trust_remote_code, _files_signature(directory))
        if key not in _TOKENIZERS:
            _TOKENIZERS.clear()  # one snapshot at a time: no unbounded growth
            _TOKENIZERS[key] = load_tokenizer(directory, trust_remote_code=card.model.trust_remote_code)
        return _TOKENIZERS[key]
    tokenizer = load_tokenizer(directory, trust_remote_code=card.model.trust_remote_code)
    template = Path(card.model.chat_template).expanduser()
    if not template.is_file():
        raise UsageError(f"model.chat_template: {template} is not a file; pass --chat-template FILE with a Jinja chat template")
    tokenizer.chat_template = template.read_text(encoding="utf-8")
    return tokenizer


def tokenizer_info(tokenizer: Any, path: Path) -> dict[str, Any]:
    """What the manifest records about the tokenizer: class, vocabulary size, file and chat-template hashes."""
    template = getattr(tokenizer, "chat_template", None) or ""
    tok_file = next((path / name for name in ("tokenizer.json", "tiktoken.model") if (path / name).exists()), path / "tokenizer.json")
    return {
        "path": str(path),
        "class": type(tokenizer).__name__,
        "vocab_size": len(tokenizer),
        "fingerprint": hashlib.sha256(tok_file.read_bytes()).hexdigest() if tok_file.exists() else None,
        "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest() if template else None,
    }

"""Remote code, on purpose only: which snapshot files ship Python, and the one refusal.

Some snapshots (Kimi-K2.5) cannot be used without running Python code they ship: an
``auto_map`` in ``tokenizer_config.json`` (a tiktoken tokenizer class), in
``config.json`` (model classes) or in the processor configs (the multimodal
processor SGLang loads). transformers would refuse them with a long message, or
(worse) the code would run without anyone asking. Here the choice is one card
field, ``model.trust_remote_code`` (``--trust-remote-code``), and a snapshot that
needs it while it is off is refused by :class:`RemoteCodeError`, naming the file and
the flag. Every ``from_pretrained`` of the package goes through
:func:`hs_dataset.model.tokenizer.load_tokenizer` or :func:`from_pretrained_kwargs`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hs_dataset.errors import CaptureError

__all__ = [
    "PROCESSOR_CONFIGS",
    "REMOTE_CODE_CONFIGS",
    "RemoteCodeError",
    "auto_map",
    "check_remote_code",
    "from_pretrained_kwargs",
    "remote_code_users",
]

# Files whose ``auto_map`` names Python classes shipped with the snapshot.
PROCESSOR_CONFIGS = ("processor_config.json", "preprocessor_config.json")
REMOTE_CODE_CONFIGS = ("config.json", "tokenizer_config.json", *PROCESSOR_CONFIGS)


class RemoteCodeError(CaptureError, PermissionError):
    """The snapshot needs its own Python code (``auto_map``) but remote code was not allowed."""


def auto_map(path: Path) -> dict[str, Any]:
    """The ``auto_map`` of one JSON config file (empty when the file is absent, unreadable or has none)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    found = raw.get("auto_map") if isinstance(raw, dict) else None
    return found if isinstance(found, dict) else {}


def remote_code_users(directory: str | os.PathLike, files: tuple[str, ...] = REMOTE_CODE_CONFIGS) -> dict[str, list[str]]:
    """``{config file: [Auto class, ...]}`` for every file of ``directory`` whose ``auto_map`` names shipped code."""
    found: dict[str, list[str]] = {}
    for name in files:
        mapping = auto_map(Path(directory) / name)
        if mapping:
            found[name] = sorted(mapping)
    return found


def check_remote_code(directory: str | os.PathLike, trust_remote_code: bool, files: tuple[str, ...] = REMOTE_CODE_CONFIGS) -> None:
    """Refuse, in one line, a snapshot whose ``files`` need remote code while it is not allowed."""
    if trust_remote_code:
        return
    users = remote_code_users(directory, files)
    if users:
        where = "; ".join(f"{Path(directory) / name} (auto_map: {', '.join(classes)})" for name, classes in users.items())
        raise RemoteCodeError(
            f"the model snapshot ships Python code that must run to load it: {where}; if you trust this snapshot, "
            "pass --trust-remote-code (or set model.trust_remote_code: true in the card)"
        )


def from_pretrained_kwargs(
    directory: str | os.PathLike, trust_remote_code: bool, files: tuple[str, ...] = ("config.json",)
) -> dict[str, Any]:
    """The keyword arguments of a model/config ``from_pretrained``: local files only, remote code as chosen (checked)."""
    check_remote_code(directory, trust_remote_code, files)
    return {"local_files_only": True, "trust_remote_code": trust_remote_code}

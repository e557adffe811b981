"""Remote code, on purpose only: which snapshot files ship Python, and the loaders that honour the choice.

Some snapshots (Kimi-K2.5) cannot be used without running Python code they ship: an
``auto_map`` in ``tokenizer_config.json`` (a tiktoken tokenizer class), in
``config.json`` (model classes) or in the processor configs (the multimodal
processor SGLang loads). transformers would refuse them with a long message, or
(worse) the code would run without anyone asking. Here the choice is one card
field, ``model.trust_remote_code`` (``--trust-remote-code``), and a snapshot that
needs it while it is off is refused by :class:`RemoteCodeError`, naming the file and
the flag. Every ``from_pretrained`` of the package goes through :func:`load_tokenizer`
or :func:`from_pretrained_kwargs`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hs_dataset.capture.model_info import text_config
from hs_dataset.errors import CaptureError

__all__ = [
    "RemoteCodeError",
    "REMOTE_CODE_CONFIGS",
    "PROCESSOR_CONFIGS",
    "remote_code_users",
    "check_remote_code",
    "from_pretrained_kwargs",
    "load_tokenizer",
    "ProcessorFilesError",
    "check_processor_files",
]

# Files whose ``auto_map`` names Python classes shipped with the snapshot.
PROCESSOR_CONFIGS = ("processor_config.json", "preprocessor_config.json")
REMOTE_CODE_CONFIGS = ("config.json", "tokenizer_config.json", *PROCESSOR_CONFIGS)


class RemoteCodeError(CaptureError, PermissionError):
    """The snapshot needs its own Python code (``auto_map``) but remote code was not allowed."""


def _auto_map(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    auto_map = raw.get("auto_map") if isinstance(raw, dict) else None
    return auto_map if isinstance(auto_map, dict) else {}


def remote_code_users(directory: str | os.PathLike, files: tuple[str, ...] = REMOTE_CODE_CONFIGS) -> dict[str, list[str]]:
    """``{config file: [Auto class, ...]}`` for every file of ``directory`` whose ``auto_map`` names shipped code."""
    found: dict[str, list[str]] = {}
    for name in files:
        auto_map = _auto_map(Path(directory) / name)
        if auto_map:
            found[name] = sorted(auto_map)
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


def from_pretrained_kwargs(directory: str | os.PathLike, trust_remote_code: bool, files: tuple[str, ...] = ("config.json",)) -> dict[str, Any]:
    """The keyword arguments of a model/config ``from_pretrained``: local files only, remote code as chosen (checked)."""
    check_remote_code(directory, trust_remote_code, files)
    return {"local_files_only": True, "trust_remote_code": trust_remote_code}


def load_tokenizer(directory: str | os.PathLike, *, trust_remote_code: bool = False) -> Any:
    """``AutoTokenizer`` for a local snapshot, refusing remote code that was not asked for."""
    from transformers import AutoTokenizer

    check_remote_code(directory, trust_remote_code, ("tokenizer_config.json",))
    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=trust_remote_code)


class ProcessorFilesError(CaptureError, FileNotFoundError):
    """A multimodal snapshot lacks (or cannot load) the processor files SGLang loads before serving."""


def _class_refs(auto_map: dict[str, Any]) -> list[str]:
    refs: list[str] = []
    for value in auto_map.values():
        refs.extend(v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str))
    return refs


def check_processor_files(directory: str | os.PathLike, trust_remote_code: bool) -> None:
    """For a multimodal wrapper: the processor config exists and its shipped classes import, before SGLang starts.

    SGLang loads the multimodal processor (Kimi-K2.5: Moonshot's remote-code
    processor) even when only token ids are sent, and fails deep in its start-up
    when a file is missing; this names the file up front. Plain text models pass.
    """
    directory = Path(directory)
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if text_config(config) is config:
        return
    present = [name for name in PROCESSOR_CONFIGS if (directory / name).is_file()]
    if not present:
        raise ProcessorFilesError(
            f"{directory}: {config.get('architectures', ['this multimodal model'])[0]} needs its processor config "
            f"({' or '.join(PROCESSOR_CONFIGS)}), which SGLang loads even for token ids; copy it (and the processing_*.py "
            "files it names) from the model's snapshot"
        )
    check_remote_code(directory, trust_remote_code, ("tokenizer_config.json", *present))
    for name in ("tokenizer_config.json", *present):
        for ref in _class_refs(_auto_map(directory / name)):
            _load_shipped_class(directory, name, ref)


def _load_shipped_class(directory: Path, config_name: str, ref: str) -> None:
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    module = ref.split("--")[-1].rpartition(".")[0]
    if not (directory / f"{module}.py").is_file():
        raise ProcessorFilesError(f"{directory / config_name}: auto_map names {ref!r} but {directory / (module + '.py')} is missing; copy it from the model's snapshot")
    try:
        get_class_from_dynamic_module(ref, str(directory), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 -- whatever the shipped code raises, named with its file
        raise ProcessorFilesError(f"{directory / (module + '.py')} (from {config_name}) does not load: {type(exc).__name__}: {exc}") from exc

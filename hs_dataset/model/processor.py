"""The processor a multimodal wrapper's SGLang server loads before serving: there, importable, complete.

SGLang loads the multimodal processor (Kimi-K2.5: Moonshot's remote-code processor)
even when only token ids are sent; :func:`check_processor_files` does the same load
first and names the file in one line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hs_dataset.errors import CaptureError
from hs_dataset.model.model_config import text_config
from hs_dataset.model.remote_code import PROCESSOR_CONFIGS, auto_map, check_remote_code

__all__ = ["ProcessorFilesError", "check_processor_files"]


class ProcessorFilesError(CaptureError, FileNotFoundError):
    """A multimodal snapshot lacks (or cannot load) the processor files SGLang loads before serving."""


# What SGLang 0.5.23 reads of a wrapper's processor while it starts (before any request), by the wrapper's
# model_type: Kimi-K2.5, multimodal/processors/kimi_k25.py (KimiK2_5VLImageProcessor and KimiGPUProcessorWrapper).
_SGLANG_READS: dict[str, tuple[str, ...]] = {"kimi_k25": ("tokenizer", "image_processor", "media_processor.media_proc_cfg")}
_KIMI_MEDIA_KEYS = ("patch_size", "merge_kernel_size", "in_patch_limit", "patch_limit_on_one_side", "image_mean", "image_std")


def _class_refs(mapping: dict[str, Any]) -> list[str]:
    refs: list[str] = []
    for value in mapping.values():
        refs.extend(v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str))
    return refs


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def check_processor_files(directory: str | os.PathLike, trust_remote_code: bool) -> None:
    """For a multimodal wrapper: the processor SGLang loads is there, imports, loads and has what SGLang reads.

    SGLang loads the multimodal processor (Kimi-K2.5: Moonshot's remote-code
    processor) even when only token ids are sent, and fails deep in its start-up
    (after minutes of imports on a large model) when a file is missing, its code
    does not load, or it lacks an attribute SGLang reads. This does the same load
    first (``AutoProcessor.from_pretrained``, the snapshot's own code) and names the
    file in one line. Plain text models pass.
    """
    directory = Path(directory)
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if text_config(config) is config:
        return
    architecture = (config.get("architectures") or ["this multimodal model"])[0]
    present = [name for name in PROCESSOR_CONFIGS if (directory / name).is_file()]
    if not present:
        raise ProcessorFilesError(
            f"{directory}: {architecture} needs its processor config "
            f"({' or '.join(PROCESSOR_CONFIGS)}), which SGLang loads even for token ids; copy it (and the processing_*.py "
            "files it names) from the model's snapshot"
        )
    check_remote_code(directory, trust_remote_code, ("tokenizer_config.json", *present))
    for name in ("tokenizer_config.json", *present):
        for ref in _class_refs(auto_map(directory / name)):
            _load_shipped_class(directory, name, ref)
    processor, source = _load_processor(directory, present, trust_remote_code)
    _check_sglang_reads(processor, source, architecture, str(config.get("model_type", "")))


def _module_file(directory: Path, ref: str) -> Path:
    return directory / (ref.split("--")[-1].rpartition(".")[0] + ".py")


def _load_shipped_class(directory: Path, config_name: str, ref: str) -> None:
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    path = _module_file(directory, ref)
    if not path.is_file():
        raise ProcessorFilesError(
            f"{directory / config_name}: auto_map names {ref!r} but {path} is missing; copy it from the model's snapshot"
        )
    try:
        get_class_from_dynamic_module(ref, str(directory), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 -- whatever the shipped code raises, named with its file
        raise ProcessorFilesError(f"{path} (from {config_name}) does not load: {_first_line(exc)}") from exc


def _load_processor(directory: Path, present: list[str], trust_remote_code: bool) -> tuple[Any, Path]:
    """The processor as SGLang builds it (``AutoProcessor``), and the file to blame if it fails."""
    from transformers import AutoProcessor

    source = directory / present[0]
    for name in present:
        ref = auto_map(directory / name).get("AutoProcessor")
        ref = ref[0] if isinstance(ref, list) and ref else ref
        if isinstance(ref, str):
            source = _module_file(directory, ref)
            break
    try:
        processor = AutoProcessor.from_pretrained(str(directory), local_files_only=True, trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001 -- whatever the shipped code raises, named with its file
        raise ProcessorFilesError(
            f"{source}: AutoProcessor.from_pretrained({str(directory)!r}) fails, as it would in SGLang: {_first_line(exc)}"
        ) from exc
    return processor, source


def _check_sglang_reads(processor: Any, source: Path, architecture: str, model_type: str) -> None:
    """The attributes SGLang reads of this wrapper's processor when it starts (:data:`_SGLANG_READS`)."""
    for dotted in _SGLANG_READS.get(model_type, ()):
        value: Any = processor
        for part in dotted.split("."):
            value = getattr(value, part, None)
        if value is None:
            raise ProcessorFilesError(
                f"{source}: the processor ({type(processor).__name__}) has no '{dotted}', which SGLang reads to start "
                f"{architecture}; use the processor files of the model's own snapshot"
            )
    if model_type == "kimi_k25":
        cfg = processor.media_processor.media_proc_cfg
        missing = [key for key in _KIMI_MEDIA_KEYS if not isinstance(cfg, dict) or key not in cfg]
        if missing:
            raise ProcessorFilesError(
                f"{source}: media_processor.media_proc_cfg lacks {missing}, which SGLang reads to start {architecture} "
                "(preprocessor_config.json media_proc_cfg); use the processor files of the model's own snapshot"
            )

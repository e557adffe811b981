"""Build a fixture directory once per recipe, safely under concurrent callers."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["build_once"]


def build_once(target: Path, marker: str, write: Callable[[Path], None]) -> Path:
    """Return ``target``, first running ``write`` into a temporary sibling renamed into place.

    ``marker`` is the file whose presence means the build finished. Concurrent callers
    (``num_proc`` workers, parallel tests) never see a half-written directory: the
    loser of the rename race keeps the winner's copy.
    """
    if (target / marker).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        write(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / marker).exists():  # lost a race only if the winner finished
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target

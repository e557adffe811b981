"""How progress is shown in this process: the interval of the plain lines, the stream, the clock.

The command line sets them once for every command (:func:`showing`); the library code
that runs a long loop opens a task (:mod:`hs_dataset.progress.task`) under whatever is
set, and shows nothing when nothing is (a library caller's default).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO

from hs_dataset.errors import UsageError

__all__ = ["DEFAULT_INTERVAL_S", "INTERVAL_ENV", "ProgressSettings", "active", "interval_from_env", "showing"]

DEFAULT_INTERVAL_S = 30.0
INTERVAL_ENV = "HS_DATASET_PROGRESS_INTERVAL"


@dataclass(frozen=True)
class ProgressSettings:
    """``interval_s``: seconds between plain lines (0: only the final line). ``bar``: None picks a bar on a terminal only.

    ``stream``: where lines go (None: ``sys.stderr`` when a task opens). ``clock``: injectable so tests need no sleep.
    ``heartbeat``: a thread that writes a due line even while nothing advances (a slow first batch, a stalled server).
    """

    interval_s: float = DEFAULT_INTERVAL_S
    stream: TextIO | None = None
    bar: bool | None = None
    clock: Callable[[], float] = time.monotonic
    heartbeat: bool = True

    def output(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stderr

    def wants_bar(self) -> bool:
        """A bar only where a person watches a terminal; a file or pipe gets plain lines."""
        if self.bar is not None:
            return self.bar
        isatty = getattr(self.output(), "isatty", None)
        return bool(isatty and isatty())


def interval_from_env(default: float = DEFAULT_INTERVAL_S) -> float:
    """``$HS_DATASET_PROGRESS_INTERVAL`` seconds, else ``default``; a value that is no number >= 0 is refused by name."""
    text = os.environ.get(INTERVAL_ENV, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise UsageError(f"{INTERVAL_ENV}={text!r}: give the seconds between progress lines as a number >= 0 (0: only the final line)")
    return value


_active: ProgressSettings | None = None


def active() -> ProgressSettings | None:
    """The settings the command line set, None when progress is off or nobody set it (a library caller)."""
    return _active


@contextmanager
def showing(settings: ProgressSettings | None) -> Iterator[None]:
    """Show progress with ``settings`` inside the block (None: show none); the previous setting is restored after."""
    global _active
    previous, _active = _active, settings
    try:
        yield
    finally:
        _active = previous

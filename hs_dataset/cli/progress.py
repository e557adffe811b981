"""The progress flags every command takes, and the settings they make (:mod:`hs_dataset.progress`).

A terminal gets a bar; a file or pipe (``> log.txt``, nohup, SLURM) a plain line every
``--progress-interval`` seconds (``$HS_DATASET_PROGRESS_INTERVAL``, default 30; 0: only
the final line). ``--no-progress`` shows none.
"""

from __future__ import annotations

import argparse

from hs_dataset.progress.settings import DEFAULT_INTERVAL_S, INTERVAL_ENV, ProgressSettings, interval_from_env

__all__ = ["add_progress_flags", "progress_settings"]


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text!r}")
    return value


def add_progress_flags(parser: argparse.ArgumentParser, *, top_level: bool) -> None:
    """``--progress-interval`` and ``--no-progress``, before or after the command name (as the other global flags)."""
    default: object = None if top_level else argparse.SUPPRESS
    parser.add_argument(
        "--progress-interval",
        type=_seconds,
        default=default,
        metavar="SECONDS",
        help=f"without a terminal: a progress line every SECONDS (0: only the final line; default: ${INTERVAL_ENV}, else {DEFAULT_INTERVAL_S:g})",
    )
    parser.add_argument(
        "--no-progress", action="store_true", default=False if top_level else argparse.SUPPRESS, help="no progress bar or lines"
    )


def progress_settings(args: argparse.Namespace) -> ProgressSettings | None:
    """What the flags ask for: None with ``--no-progress``, else the interval given or the environment's."""
    if getattr(args, "no_progress", False):
        return None
    interval = getattr(args, "progress_interval", None)
    return ProgressSettings(interval_s=interval if interval is not None else interval_from_env())

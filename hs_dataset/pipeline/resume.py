"""What a build records so that a person can resume it, and what it says when it is stopped.

A build writes its ``build`` record (:mod:`hs_dataset.formats.build_state`) as it opens
the directory: the samples it expects and the command that resumes it, so that
``verify`` and ``info`` on a killed build can print both. The command is the one the
CLI ran; a build started from Python records an equivalent ``hs-dataset build`` line.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from hs_dataset.config import Card
from hs_dataset.config.run import BuildOptions
from hs_dataset.errors import HsDatasetError
from hs_dataset.formats.build_state import RUNNING, BuildState, progress_phrase, resume_hint
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest

__all__ = ["build_command", "interrupted_message", "running_state"]


def build_command(card: Card, out: str | os.PathLike, opts: BuildOptions) -> str:
    """The command this build records: the CLI's own, else an ``hs-dataset build`` line with the options that choose the samples."""
    if opts.command:
        return opts.command
    config = card.source_path if os.path.isfile(card.source_path) else card.name
    argv = ["hs-dataset", "build", "--config", config, "--out", os.fspath(out)]
    if isinstance(opts.source, (str, os.PathLike)):
        argv += ["--source", os.fspath(opts.source)]
    if opts.num_samples is not None:
        argv += ["--num-samples", str(opts.num_samples)]
    if opts.world_size > 1:
        argv += ["--rank", str(opts.rank), "--world-size", str(opts.world_size)]
    return shlex.join(argv)


def running_state(card: Card, out: str | os.PathLike, opts: BuildOptions, expected: int | None) -> BuildState:
    """The record a build writes as it starts: running, ``expected`` samples, its command and where it ran."""
    return BuildState(RUNNING, expected, build_command(card, out, opts), os.getcwd())


def interrupted_message(local_dir: Path) -> str:
    """``interrupted: N of M samples stored; re-run the same command to resume: CMD``, read off the manifest on disk."""
    try:
        manifest = Manifest.load(local_dir) if (local_dir / MANIFEST_NAME).exists() else None
    except (HsDatasetError, OSError):
        manifest = None
    if manifest is None or manifest.build is None:
        return "interrupted before the dataset recorded its build; re-run the same command to resume"
    build = manifest.build
    return f"interrupted: {progress_phrase(manifest.num_samples, build.samples_expected)}; re-run the same command to resume: {resume_hint(build)}"

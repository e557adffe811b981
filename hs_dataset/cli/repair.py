"""``hs-dataset repair DIR``: capture again the samples of a dataset's corrupted, truncated or missing shards.

Why a command of its own, and not every resume: finding a corrupted shard means hashing
every byte of the dataset (terabytes for a large capture); a resume after a kill must
not pay that each time. ``repair`` pays it once, on purpose, then runs the build command
the manifest records (``build.command``, from ``build.cwd``): that build resumes the
dataset, and since the damaged shards are no longer listed it captures exactly their
samples again, with the same card, model and source (a regenerated dataset's
conversations are read back from its ``regenerated.jsonl``, never generated anew).
The dataset side (take out, check back) is :mod:`hs_dataset.formats.repair`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hs_dataset.formats.manifest import Manifest
    from hs_dataset.formats.repair import RepairOutcome

__all__ = ["EXAMPLES", "HELP", "add_arguments", "run"]

HELP = "capture again the samples of a dataset's corrupted, truncated or missing shards (same model, card and source)"
DESCRIPTION = (
    HELP + ".\n\nHashes every shard (as verify does), takes the damaged ones out of the manifest, then runs the build\n"
    "command the manifest records, which stores their samples again; re-run it after an interruption."
)
EXAMPLES = """
  hs-dataset repair out/tiny         # then: hs-dataset verify out/tiny
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="dataset directory (holds manifest.json) written by `hs-dataset build`")


def run(args: argparse.Namespace) -> int:
    from hs_dataset.formats.dirlock import acquire_dir_lock, release_dir_lock
    from hs_dataset.formats.manifest import Manifest
    from hs_dataset.formats.paths import check_local_path
    from hs_dataset.formats.repair import find_damaged, take_out

    root = check_local_path(args.path, what="dataset")
    manifest = Manifest.load(root)
    cwd = manifest.build.cwd if manifest.build else None
    build_args = _recorded_build(root, manifest)  # every refusal comes before anything changes
    lock = acquire_dir_lock(root)
    try:
        manifest = Manifest.load(root)
        damaged = find_damaged(root, manifest)
        if damaged:
            manifest = take_out(root, manifest, damaged)
    finally:
        release_dir_lock(lock)
    if manifest.repair is None:
        print(f"{root}: every shard is whole; nothing to repair")
        return 0
    for shard in damaged:
        print(f"taken out: {shard.file} ({shard.samples} samples): {shard.reason}")
    listed = {s.file for s in manifest.shards}
    print(
        f"capturing again {manifest.repair.owed} sample(s) with the recorded build command: {manifest.build.command if manifest.build else ''}"
    )
    _run_build(root, build_args, cwd)
    return _conclude(root, listed)


def _recorded_build(root: Path, manifest: Manifest) -> argparse.Namespace:
    """The recorded build command, parsed as ``hs-dataset build`` parses it, pointed at ``root``; refused in one line if it cannot repair."""
    from hs_dataset.errors import UsageError

    build = manifest.build
    if build is None or not build.command:
        raise UsageError(
            f"cannot repair {root}: its manifest records no build command (field build.command; written by merge, import or an "
            "older hs_dataset): repair each merged part, then merge again, or rebuild it into a new directory"
        )
    args = _parse_build(root, build.command)
    absolute = Path(os.path.abspath(root))  # root as given is relative to here, not to build.cwd
    with _in_directory(root, build.cwd):
        _check_out(root, absolute, args)
        _check_inputs(root, args)
    _keep_regeneration(manifest, args)
    return args


def _parse_build(root: Path, command: str) -> argparse.Namespace:
    from hs_dataset.cli.main import build_parser
    from hs_dataset.errors import UsageError

    argv = shlex.split(command)
    try:
        args = build_parser().parse_args(argv[1:])
    except SystemExit:
        args = None
    if argv[:1] != ["hs-dataset"] or args is None or getattr(args, "command", None) != "build":
        raise UsageError(
            f"cannot repair {root}: field build.command {command[:200]!r} is not an `hs-dataset build` command this hs_dataset "
            "parses; re-run the build that wrote it by hand"
        )
    args._argv = argv[1:]  # the build records the same command again
    return args


def _with_out(argv: list[str], out: str) -> list[str]:
    """``argv`` with its ``--out`` value replaced (``--out X`` or ``--out=X``), so the build records the command that resumes ``out``."""
    result = list(argv)
    for i, arg in enumerate(result):
        if arg == "--out" and i + 1 < len(result):
            result[i + 1] = out
        elif arg.startswith("--out="):
            result[i] = f"--out={out}"
    return result


@contextlib.contextmanager
def _in_directory(root: Path, cwd: str | None) -> Iterator[None]:
    """Where the build ran (``build.cwd``): its relative paths (``--out``, ``--source``, a card) are relative to it."""
    from hs_dataset.errors import UsageError

    if cwd is None:
        yield
        return
    if not os.path.isdir(cwd):
        raise UsageError(
            f"cannot repair {root}: the build ran in {cwd} (field build.cwd), which is gone; recreate it with the build's inputs, "
            f"then run `hs-dataset repair {shlex.quote(str(root))}` again"
        )
    here = os.getcwd()
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(here)


def _check_out(root: Path, absolute: Path, args: argparse.Namespace) -> None:
    """The recorded ``--out`` must be ``root``: a moved dataset is repaired where it now is, under an equivalent command."""
    from hs_dataset.errors import UsageError

    if "://" in str(args.out):
        raise UsageError(f"cannot repair {root}: its build wrote to {args.out}, a URL; repair works on the local directory a build wrote")
    if not (os.path.isdir(args.out) and os.path.samefile(args.out, absolute)):
        args.out = str(absolute)
        args._argv = _with_out(args._argv, str(absolute))  # every other option kept: the batch size decides the bytes too


def _check_inputs(root: Path, args: argparse.Namespace) -> None:
    """The card and a local source must still be there; an ``hf:`` stream is checked by what comes back."""
    from hs_dataset.cli.card_args import card_from_args
    from hs_dataset.errors import HsDatasetError, UsageError

    again = f"then run `hs-dataset repair {shlex.quote(str(root))}` again"
    try:
        card = card_from_args(args)
    except (HsDatasetError, OSError) as exc:
        raise UsageError(
            f"cannot repair {root}: the card of its build no longer loads ({str(exc).splitlines()[0]}); restore it, {again}"
        ) from None
    source = args.source if args.source is not None else card.source.path
    if not isinstance(source, str) or source.startswith(("hf:", "builtin:")) or "://" in source or not source:
        return
    if not os.path.exists(source):
        raise UsageError(
            f"cannot repair {root}: its source {os.path.abspath(source)} is gone (the recorded build reads it; the repair captures "
            f"the damaged shards' samples from it); restore that file with the same rows, {again}"
        )


def _keep_regeneration(manifest: Manifest, args: argparse.Namespace) -> None:
    """A regenerated dataset is repaired from its stored conversations: the build must regenerate as it did (it then reads them back)."""
    record = manifest.metadata.regeneration
    if record is None or args.regenerate:
        return
    args.regenerate, args.max_new_tokens, args.thinking = True, record.max_new_tokens, record.thinking
    thinking = ["--thinking", record.thinking] if record.thinking else []
    args._argv = [*args._argv, "--regenerate", "--max-new-tokens", str(record.max_new_tokens), *thinking]


def _run_build(root: Path, args: argparse.Namespace, cwd: str | None) -> None:
    """The recorded build, from where it ran; a different model or card is refused by the build's own identity check."""
    from hs_dataset.cli import build
    from hs_dataset.errors import ForeignDatasetError

    with _in_directory(root, cwd):
        try:
            build.run(args)
        except ForeignDatasetError as exc:
            raise ForeignDatasetError(
                f"cannot repair {root}: the repair re-captures with the model and card the dataset was built with, and {exc}"
            ) from None


def _conclude(root: Path, listed_before: set[str]) -> int:
    """Check every taken-out sample is stored again, and say so (or name what is still missing, in one line)."""
    from hs_dataset.errors import IntegrityError
    from hs_dataset.formats.dirlock import acquire_dir_lock, release_dir_lock
    from hs_dataset.formats.manifest import Manifest
    from hs_dataset.formats.repair import conclude

    lock = acquire_dir_lock(root)
    try:
        written = {s.file for s in Manifest.load(root).shards} - listed_before
        outcome = conclude(root, written)
    finally:
        release_dir_lock(lock)
    if not outcome.complete:
        raise IntegrityError(_shortfall(root, outcome))
    print(_summary(root, outcome))
    return 0


def _summary(root: Path, outcome: RepairOutcome) -> str:
    replaced = ", ".join(s.file for s in outcome.replaced)
    return (
        f"repaired {root}: captured again {outcome.recaptured} sample(s) of {replaced}, now in {', '.join(outcome.now_in) or '-'}; "
        f"check it with `hs-dataset verify {shlex.quote(str(root))}`"
    )


def _shortfall(root: Path, outcome: RepairOutcome) -> str:
    replaced = ", ".join(s.file for s in outcome.replaced)
    lost = len(outcome.missing_ids) + outcome.short
    first = f" (first {outcome.missing_ids[0]!r})" if outcome.missing_ids else ""
    return (
        f"cannot repair {root} fully: {lost} sample(s) of {replaced}{first} were not captured again: the source no longer yields "
        "them (an hf: dataset changed upstream, or the file was edited); the manifest's repair record keeps them owed: restore the "
        f"source the build read, then run `hs-dataset repair {shlex.quote(str(root))}` again"
    )

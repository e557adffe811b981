"""``check`` / ``apply`` / ``revert`` of the SGLang <= 0.5.5 source patch: the command line, and the script.

``hs-dataset patch`` (:mod:`hs_dataset.cli.patch`) uses :func:`add_arguments` and
:func:`run`. In a server environment without hs_dataset installed, this file runs by
path on the bare standard library::

    python hs_dataset/server_patch/legacy/patch.py check|apply|revert --file .../deepseek_v2.py

(or ``python -m hs_dataset.server_patch.legacy.patch``): run by path, it first puts the
checkout it lies in on ``sys.path``, so that its package (standard library only:
:mod:`.edit`, :mod:`.anchors`, :mod:`.inserted`, :mod:`.locate`) imports from there.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by path: its package, from the checkout this file is in
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from hs_dataset.server_patch.legacy import edit
from hs_dataset.server_patch.legacy.anchors import split_lines
from hs_dataset.server_patch.legacy.edit import LegacyPatchError, PatchState, PatchStatus
from hs_dataset.server_patch.legacy.locate import locate_deepseek_v2, sglang_version

__all__ = ["add_arguments", "main", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `hs-dataset patch` (also used when this file runs as a script)."""
    parser.add_argument(
        "action",
        choices=["check", "apply", "revert"],
        help="check: report state (exit 0 patched, 1 unpatched, 2 other); apply: patch (idempotent); revert: restore the original",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--file", help="path of sglang/srt/models/deepseek_v2.py")
    where.add_argument("--sglang-root", help="sglang package directory (or the site-packages holding it)")
    where.add_argument("--python", help="the SGLang server's Python; its sglang is located")
    parser.add_argument("--dry-run", action="store_true", help="apply: print the diff, write nothing")
    parser.add_argument(
        "--force", action="store_true", help="revert: restore the verified backup even if the file was edited after patching"
    )
    parser.add_argument("--json", action="store_true", help="print the status as JSON")


def _print_status(status: PatchStatus, args: argparse.Namespace, version: str | None) -> None:
    if args.json:
        print(json.dumps(dict(status.to_dict(), sglang_version=version), indent=2))
        return
    print(f"{status.path}: {status.state.value}" + (f" (sglang {version})" if version else ""))
    print(f"  {status.reason}")
    if status.anchors:
        print("  anchors: " + ", ".join(f"{k} L{v}" for k, v in status.anchors.items()))


def run(args: argparse.Namespace) -> int:
    """Carry out the parsed action; refusals raise :class:`LegacyPatchError` (the caller reports them)."""
    path = Path(args.file) if args.file else locate_deepseek_v2(args.sglang_root, args.python)
    version = None if args.file else sglang_version(path)
    if args.action == "check":
        status = edit.check(path)
        _print_status(status, args, version)
        return {PatchState.PATCHED: 0, PatchState.UNPATCHED: 1}.get(status.state, 2)
    if args.action == "apply" and args.dry_run:
        text = edit.read_source(path)
        sys.stdout.writelines(difflib.unified_diff(split_lines(text), split_lines(edit.patch_text(text)), str(path), f"{path} (patched)"))
        return 0
    status = edit.apply(path) if args.action == "apply" else edit.revert(path, force=args.force)
    _print_status(status, args, version)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Script entry point, for servers without hs_dataset installed (its messages name it ``legacy_patch.py``)."""
    parser = argparse.ArgumentParser(
        prog="legacy_patch.py", description="Check / apply / revert the hs_dataset capture patch (SGLang <= 0.5.5)."
    )
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except (LegacyPatchError, OSError) as exc:
        print(f"legacy_patch.py: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

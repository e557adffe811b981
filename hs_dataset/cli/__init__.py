"""The ``hs-dataset`` command line: :mod:`hs_dataset.cli.main` plus one module per command."""

from __future__ import annotations

__all__ = ["main"]


def main(argv=None) -> int:
    """Entry point kept importable as ``hs_dataset.cli.main`` for ``python -m`` and tests."""
    from hs_dataset.cli.main import main as _main

    return _main(argv)

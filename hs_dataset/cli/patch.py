"""``hs-dataset patch check|apply|revert``: the source patch for SGLang <= 0.5.5.

The work is done by hs_dataset.server_patch.legacy (its command line:
hs_dataset.server_patch.legacy.patch), which is standard library only so that it can also
run as a script inside the SGLang server's environment; this module only plugs it
into ``hs-dataset``.
See docs/LEGACY_PATCH.md.
"""

from __future__ import annotations

import argparse

__all__ = ["DESCRIPTION", "EXAMPLES", "HELP", "add_arguments", "run"]

HELP = "check / apply / revert the source patch for SGLang <= 0.5.5"
DESCRIPTION = (
    HELP + ".\n\nDefault target: sglang/srt/models/deepseek_v2.py of the sglang installed for this Python\n"
    "(found without importing sglang). For SGLang 0.5.9+ use `hs-dataset serve` (forward hooks) instead.\n"
    "exit status of check: 0 patched, 1 not patched (apply will work), 2 unrecognised or error."
)
EXAMPLES = """
  hs-dataset patch check --python /opt/sglang/bin/python
  hs-dataset patch apply --dry-run --sglang-root /opt/sglang/lib/python3.11/site-packages
  hs-dataset patch revert --file sglang/srt/models/deepseek_v2.py
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hs_dataset.server_patch.legacy import patch

    patch.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from hs_dataset.server_patch.legacy import patch

    return patch.run(args)

"""``legacy`` on the server: the source patch of an SGLang without forward hooks (<= 0.5.5).

The patched ``forward`` hands the states to :mod:`hs_dataset.server_patch.legacy.hook`
itself, so no model hook reads a pass. Its batches carry no request ids: dumps are keyed by
content, and a server that lets partial prompts reach a pass is refused
(:func:`legacy_problems`), besides the token-scattering set-ups.
"""

from __future__ import annotations

from typing import Any

from hs_dataset.server_patch.contract.mechanism import Mechanism
from hs_dataset.server_patch.mechanisms.base import ServerMechanism, scattering_problems

__all__ = ["Legacy", "legacy_problems"]


class Legacy(ServerMechanism):
    mechanism = Mechanism.LEGACY

    def server_problems(self, args: Any) -> list[str]:
        return scattering_problems(args) + legacy_problems(args)


def legacy_problems(args: Any) -> list[str]:
    """What keeps whole prompts from reaching one forward pass (SGLang's server arguments; ``None``: unknown)."""
    if args is None:
        return []
    problems = []
    chunk = getattr(args, "chunked_prefill_size", None)
    if chunk is not None and int(chunk) > 0:
        problems.append(
            f"chunked prefill is on (chunked_prefill_size {chunk}) and this SGLang's batches carry no request ids, so "
            "the chunks of one prompt cannot be joined: restart it with --chunked-prefill-size -1"
        )
    if not getattr(args, "disable_radix_cache", True):
        problems.append(
            "the radix cache is on and this SGLang's batches carry no request ids, so a prefix-cache hit (only the "
            "prompt's tail computed) cannot be refused by name: restart it with --disable-radix-cache"
        )
    return problems

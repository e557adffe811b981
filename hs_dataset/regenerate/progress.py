"""What a long regeneration shows: conversations done, tokens/s generated and captured, and the time left.

It is one :class:`~hs_dataset.progress.task.Task` named ``regenerate``, shown like every
other command's progress: a bar above the build's on a terminal, else a plain line every
interval in the log, and a final line. The tokens counted are the generated ones (as each
answer arrives, on the pump's thread); the captured tokens/s and the conversations this
run regenerated are the task's own parts of the line. The ETA counts only conversations
this run regenerated, since those read back from a stored file take no time.
"""

from __future__ import annotations

from collections.abc import Sequence

from hs_dataset.progress.settings import ProgressSettings
from hs_dataset.progress.task import Task

__all__ = ["RegenerationProgress"]


class RegenerationProgress:
    """Counters of one build's regeneration; ``total``: the conversations expected (None: unknown); ``settings`` None: silent."""

    def __init__(self, total: int | None, settings: ProgressSettings | None) -> None:
        self.captured_tokens = 0
        self.fresh = 0  # conversations this run regenerated (the task's ``fresh`` too; kept here for the line's detail)
        self.task = Task("regenerate", "conversations", total, settings=settings, detail=self._detail, tokens_label="tokens generated")

    def generated(self, tokens: int) -> None:
        """Tokens the model wrote (the pump's thread, as each answer arrives)."""
        self.task.add_tokens(tokens)

    def conversation_done(self, fresh: bool) -> None:
        """One conversation finished by this run (``fresh``) or read back from the stored file."""
        self.fresh += fresh
        self.task.advance(fresh=fresh)

    def captured(self, tokens: int) -> None:
        self.captured_tokens += tokens
        self.task.tick()

    def line(self) -> str:
        return self.task.line()

    def close(self) -> None:
        self.task.close()

    def _detail(self, elapsed_s: float) -> Sequence[str]:
        rate = [f"{self.captured_tokens / elapsed_s:,.0f} tok/s captured"] if elapsed_s > 0 else []
        return [f"{self.fresh} this run", *rate]

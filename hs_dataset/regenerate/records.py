"""What regeneration keeps: each turn's outcome, each conversation's record, and the run's counts.

Records are stored as JSON lines (``formats/regenerated.py``, docs/FORMAT.md); the
dataclasses here convert at that boundary (``to_json`` / ``from_json``) and write the
keys in the order the stored files have always had, so a resumed build's file is
byte-identical to an uninterrupted one's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hs_dataset.regenerate.generator import Finish

__all__ = ["ConversationRecord", "RegenerationReport", "TurnOutcome", "NOT_REGENERABLE"]

NOT_REGENERABLE = "not regenerable (pre-tokenized, or its first assistant turn calls tools): kept as it was"


@dataclass(frozen=True)
class TurnOutcome:
    """One assistant turn: its prompt's length, the ids the model wrote, why it stopped.

    ``refused``: the chat template could not render the prompt, so nothing was asked of
    the model (such turns are stored with ``finish`` first).
    """

    prompt_tokens: int
    token_ids: list[int]
    finish: Finish
    empty: bool
    error: str
    refused: bool = False

    @classmethod
    def template_refused(cls, error: str) -> "TurnOutcome":
        return cls(prompt_tokens=0, token_ids=[], finish="failed", empty=False, error=error, refused=True)

    def to_json(self) -> dict[str, Any]:
        if self.refused:
            return {"finish": self.finish, "empty": self.empty, "token_ids": self.token_ids, "error": self.error, "prompt_tokens": self.prompt_tokens}
        return {"prompt_tokens": self.prompt_tokens, "token_ids": self.token_ids, "finish": self.finish, "empty": self.empty, "error": self.error}

    @classmethod
    def from_json(cls, turn: dict[str, Any]) -> "TurnOutcome":
        return cls(
            prompt_tokens=turn["prompt_tokens"], token_ids=turn["token_ids"], finish=turn["finish"], empty=bool(turn["empty"]),
            error=turn["error"], refused=next(iter(turn)) == "finish",
        )


@dataclass(frozen=True)
class ConversationRecord:
    """The stored outcome of one conversation: its turns, the regenerated messages, the sample's ids and mask spans.

    ``input_ids`` is None when the conversation yields no regenerated sample; ``dropped``
    then says why (a conversation that is ``not regenerable`` is captured as written).
    """

    sample_id: str
    row_index: int | None
    turns: list[TurnOutcome]
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    input_ids: list[int] | None = None
    loss_spans: list[list[int]] = field(default_factory=list)
    supervised_turns: list[bool] = field(default_factory=list)
    dropped: str | None = None

    @property
    def not_regenerable(self) -> bool:
        return self.dropped is not None and self.dropped.startswith("not regenerable")

    def to_json(self) -> dict[str, Any]:
        return {
            "sample_id": self.sample_id, "row_index": self.row_index, "turns": [t.to_json() for t in self.turns],
            "messages": self.messages, "tools": self.tools, "input_ids": self.input_ids, "loss_spans": self.loss_spans,
            "supervised_turns": self.supervised_turns, "dropped": self.dropped,
        }

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> "ConversationRecord":
        return cls(
            sample_id=record["sample_id"], row_index=record.get("row_index"), turns=[TurnOutcome.from_json(t) for t in record["turns"]],
            messages=record["messages"], tools=record.get("tools"), input_ids=record["input_ids"], loss_spans=record["loss_spans"],
            supervised_turns=record["supervised_turns"], dropped=record["dropped"],
        )


@dataclass
class RegenerationReport:
    """What regeneration did, per conversation and per turn (in the run report)."""

    conversations: int = 0
    from_store: int = 0
    turns: int = 0
    hit_max_new_tokens: int = 0
    empty: int = 0
    failed: int = 0
    dropped: int = 0
    not_regenerable: int = 0
    unsupervised_turns: int = 0
    cut_by_max_length: int = 0

    def count(self, record: ConversationRecord) -> None:
        self.conversations += 1
        for turn in record.turns:
            self.turns += 1
            self.hit_max_new_tokens += turn.finish == "length"
            self.empty += turn.empty
            self.failed += turn.finish == "failed"
        self.dropped += record.dropped is not None and not record.not_regenerable
        self.unsupervised_turns += sum(not s for s in record.supervised_turns)

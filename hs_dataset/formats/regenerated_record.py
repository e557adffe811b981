"""The one schema of a regenerated conversation's record, as stored in ``regenerated.jsonl`` (docs/FORMAT.md).

The dataclasses are what regeneration works with; ``to_json`` writes the keys in the
order the stored files have always had, so a resumed build's file is byte-identical to
an uninterrupted one's. :func:`check_record` is the check every record read from a file
passes first (readers then index it without guards); a damaged record is a
:class:`FormatError` naming the file, the line and the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from hs_dataset.errors import FormatError
from hs_dataset.formats.vocabulary import check_token_ids

__all__ = ["FINISHES", "NOT_REGENERABLE", "ConversationRecord", "Finish", "TurnOutcome", "check_record", "damaged"]

Finish = Literal["stop", "length", "failed"]
FINISHES: tuple[str, ...] = get_args(Finish)
NOT_REGENERABLE = "not regenerable (pre-tokenized, or its first assistant turn calls tools): kept as it was"
_RECORD_KEYS = ("sample_id", "turns", "messages", "input_ids", "loss_spans", "supervised_turns", "dropped")
_FIX = "restore the file from the build that wrote it (or delete it and rebuild with --regenerate)"


@dataclass(frozen=True)
class TurnOutcome:
    """One assistant turn: its prompt's length, the ids the model wrote, why it stopped.

    ``refused``: the chat template could not render the prompt, so nothing was asked of
    the model (such turns are stored with ``finish`` first). ``cut``: what was cut off the
    generator's answer (``after its stop id``, ``at max_new_tokens``); ``malformed``: why
    the answer was refused (a structure token of the template before its end; ``finish`` is
    then ``failed``). Both are stored only when set, so earlier files read back unchanged.
    """

    prompt_tokens: int
    token_ids: list[int]
    finish: Finish
    empty: bool
    error: str
    refused: bool = False
    cut: str | None = None
    malformed: str | None = None

    @classmethod
    def template_refused(cls, error: str) -> TurnOutcome:
        return cls(prompt_tokens=0, token_ids=[], finish="failed", empty=False, error=error, refused=True)

    def to_json(self) -> dict[str, Any]:
        out = self._fields()
        if self.cut is not None:
            out["cut"] = self.cut
        if self.malformed is not None:
            out["malformed"] = self.malformed
        return out

    def _fields(self) -> dict[str, Any]:
        if self.refused:
            return {
                "finish": self.finish,
                "empty": self.empty,
                "token_ids": self.token_ids,
                "error": self.error,
                "prompt_tokens": self.prompt_tokens,
            }
        return {
            "prompt_tokens": self.prompt_tokens,
            "token_ids": self.token_ids,
            "finish": self.finish,
            "empty": self.empty,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, turn: dict[str, Any]) -> TurnOutcome:
        return cls(
            prompt_tokens=turn["prompt_tokens"],
            token_ids=turn["token_ids"],
            finish=turn["finish"],
            empty=bool(turn["empty"]),
            error=turn["error"],
            refused=next(iter(turn)) == "finish",
            cut=turn.get("cut"),
            malformed=turn.get("malformed"),
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
            "sample_id": self.sample_id,
            "row_index": self.row_index,
            "turns": [t.to_json() for t in self.turns],
            "messages": self.messages,
            "tools": self.tools,
            "input_ids": self.input_ids,
            "loss_spans": self.loss_spans,
            "supervised_turns": self.supervised_turns,
            "dropped": self.dropped,
        }

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> ConversationRecord:
        """The record of a stored line's entry (already passed :func:`check_record`)."""
        return cls(
            sample_id=record["sample_id"],
            row_index=record.get("row_index"),
            turns=[TurnOutcome.from_json(t) for t in record["turns"]],
            messages=record["messages"],
            tools=record.get("tools"),
            input_ids=record["input_ids"],
            loss_spans=record["loss_spans"],
            supervised_turns=record["supervised_turns"],
            dropped=record["dropped"],
        )


def damaged(where: str, field: str, problem: str) -> FormatError:
    """The error for a damaged regenerated-conversations file: where, which field, what is wrong, and the fix."""
    return FormatError(f"{where}: {field} {problem}; {_FIX}")


def _int_list(value: object) -> bool:
    return isinstance(value, list) and all(type(v) is int for v in value)


def _check_turn(turn: object, where: str, field: str) -> None:
    if not isinstance(turn, dict) or not _int_list(turn.get("token_ids")) or type(turn.get("prompt_tokens")) is not int:
        raise damaged(where, field, "must be an object with integer prompt_tokens and a list of integer token_ids")
    if turn.get("finish") not in FINISHES:
        raise damaged(where, f"{field}.finish", f"is {turn.get('finish')!r}, not one of {FINISHES}")
    for key in ("cut", "malformed"):
        if not isinstance(turn.get(key), (str, type(None))):
            raise damaged(where, f"{field}.{key}", "must be a string when present")


def _check_ids_and_spans(record: dict[str, Any], where: str, field: str) -> None:
    ids, spans = record["input_ids"], record["loss_spans"]
    if ids is None:
        if spans or not isinstance(record["dropped"], str):
            raise damaged(where, f"{field}.input_ids", "is null, so loss_spans must be empty and dropped must say why")
        return
    if not _int_list(ids):
        raise damaged(where, f"{field}.input_ids", "must be a list of integers (or null for a dropped conversation)")
    for span in spans:
        if not (_int_list(span) and len(span) == 2 and 0 <= span[0] < span[1] <= len(ids)):
            raise damaged(where, f"{field}.loss_spans", f"holds {str(span)[:80]}, not a [start, stop) inside the {len(ids)} input_ids")


def check_record(record: object, where: str, field: str, vocab_size: int | None = None) -> str:
    """The record's sample id, after checking the shape :meth:`ConversationRecord.to_json` writes (``where``/``field``: for the error).

    ``vocab_size``: the model's, when the reader knows it (a resuming build does), so an edited id just above the
    vocabulary is refused too; None bounds ids by the largest vocabulary a model may have.
    """
    if not isinstance(record, dict):
        raise damaged(where, field, "must be an object")
    missing = [k for k in _RECORD_KEYS if k not in record]
    if missing:
        raise damaged(where, field, f"lacks {', '.join(missing)}")
    if not isinstance(record["sample_id"], str) or not record["sample_id"]:
        raise damaged(where, f"{field}.sample_id", "must be a non-empty string")
    if not isinstance(record["dropped"], (str, type(None))):
        raise damaged(where, f"{field}.dropped", "must be null or a reason string")
    for key in ("turns", "messages", "loss_spans", "supervised_turns"):
        if not isinstance(record[key], list):
            raise damaged(where, f"{field}.{key}", "must be a list")
    for number, turn in enumerate(record["turns"]):
        _check_turn(turn, where, f"{field}.turns[{number}]")
    _check_ids_and_spans(record, where, field)
    _check_vocabulary(record, f"{where}: {field}", vocab_size)
    return record["sample_id"]


def _check_vocabulary(record: dict[str, Any], where: str, vocab_size: int | None) -> None:
    """Every id of the record (its turns', its sample's) a token id (``formats/vocabulary.py``): an edited record
    would otherwise be resumed from and stored in a shard."""
    sample = record["sample_id"]
    for number, turn in enumerate(record["turns"]):
        check_token_ids(turn["token_ids"], vocab_size, where=where, sample=sample, fix=_FIX, name=f"turns[{number}].token_ids")
    if record["input_ids"] is not None:
        check_token_ids(record["input_ids"], vocab_size, where=where, sample=sample, fix=_FIX)

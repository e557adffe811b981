"""One conversation's regeneration as steps a scheduler drives: its next prompt, each answer taken, its record.

The two schedulers (``windows.py`` for batch generators, ``pump.py`` for servers) decide
*when* a turn is asked for; what a turn's prompt is, what an answer does to the
conversation and what is stored at the end is decided here, once, so both store the
same records for the same answers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from hs_dataset.errors import FormatError
from hs_dataset.formats.regenerated import RegeneratedStore
from hs_dataset.formats.regenerated_record import NOT_REGENERABLE, ConversationRecord, Finish, TurnOutcome
from hs_dataset.regenerate.answers import cut_answer, first_structure_token
from hs_dataset.regenerate.generator import ONE_PASS_META, GenerationParams, GenerationResult, TracedGeneration
from hs_dataset.regenerate.turns import TurnRenderer, assemble, regenerable_turns, splice
from hs_dataset.sample import TokenizedSample
from hs_dataset.sources.report import MalformedRowError
from hs_dataset.sources.template_guard import RowBudget

__all__ = ["MALFORMED", "Conversation", "Finished", "TurnRules", "stored_record"]

log = logging.getLogger(__name__)
MALFORMED = "malformed answer"  # the start of a dropped conversation's reason when one of its answers was refused

Finished = tuple[TokenizedSample, ConversationRecord, bool]  # a sample, its record, whether this run regenerated it


@dataclass
class Conversation:
    """One conversation while it is regenerated: the turns to rewrite and what was written so far."""

    sample: TokenizedSample
    turns: list[int]  # indexes of the assistant messages to rewrite
    messages: list[dict[str, Any]] = field(default_factory=list)  # the context so far, rewritten turns included
    pos: int = 0  # source messages consumed
    prompts: list[list[int]] = field(default_factory=list)
    answers: list[TurnOutcome] = field(default_factory=list)
    stopped: str | None = None
    budget: RowBudget | None = None  # the conversation's template time, shared by all of its turns' renders
    traced: list[TracedGeneration] = field(default_factory=list)  # generations whose states the server kept (one pass)

    @property
    def more(self) -> bool:
        """Whether a turn is still to be asked for."""
        return self.stopped is None and len(self.answers) < len(self.turns)

    @property
    def generated_tokens(self) -> int:
        return sum(len(a.token_ids) for a in self.answers)

    def finished_sample(self) -> TokenizedSample:
        """The source sample, carrying the traces of its one-pass generations (``meta["one_pass"]``) for capture."""
        if not self.traced:
            return self.sample
        return replace(self.sample, meta={**self.sample.meta, ONE_PASS_META: tuple(self.traced)})


@dataclass(frozen=True)
class TurnRules:
    """What a turn is and what its answer does: the renderer, the generation parameters, the drop policy, the turn limit.

    ``structure``: the template's structure tokens (``answers.structure_tokens``), which no kept answer may hold.
    """

    renderer: TurnRenderer
    params: GenerationParams
    policy: str = "keep"
    turn_limit: int | None = None
    structure: Mapping[int, str] = field(default_factory=dict)

    def start(self, sample: TokenizedSample) -> Conversation:
        conv = sample.meta.get("conversation")
        turns = regenerable_turns(conv, self.turn_limit) if conv is not None else []
        return Conversation(sample, turns, budget=RowBudget(self.renderer.chat.limits))

    def next_prompt(self, conv: Conversation) -> list[int] | None:
        """The prompt of the conversation's next turn; None when it has none left (or the template refused it, which ends it)."""
        if not conv.more:
            return None
        source = conv.sample.meta["conversation"]
        index = conv.turns[len(conv.prompts)]
        context = conv.messages + source.messages[conv.pos : index]
        try:
            prompt = self.renderer.prompt_ids(context, source.tools, conv.budget)
            if conv.prompts:
                prompt = self._spliced(conv, prompt, source.tools) or prompt
        except MalformedRowError as exc:
            conv.answers.append(TurnOutcome.template_refused(str(exc)))
            conv.stopped = "failed"
            return None
        conv.messages, conv.pos = context, index + 1
        return prompt

    def _spliced(self, conv: Conversation, fresh: list[int], tools: Any) -> list[int] | None:
        """The next prompt holding the previous turn's ids as the model wrote them (None: the template rewrote it)."""
        history = self.renderer.render_ids(conv.messages, tools, generation_prompt=False, budget=conv.budget)
        answer = conv.answers[-1].token_ids
        stop = self.params.stop_token_ids
        end_id = next((t for t in stop if answer and t == answer[-1]), stop[0])
        return splice(conv.prompts[-1], answer, history, fresh, end_id)

    def take_turn(self, conv: Conversation, prompt: list[int], result: GenerationResult) -> None:
        """The answer to ``prompt``, cut to what the model generated: kept as the next turn, or the end of the
        conversation (failed, refused as malformed, or dropped by policy)."""
        turn = self._outcome(prompt, result)
        conv.answers.append(turn)
        if turn.finish == "failed":
            conv.stopped = MALFORMED if turn.malformed else "failed"
            if turn.malformed:
                log.warning("%s: turn %d refused, conversation not stored: %s", conv.sample.sample_id, len(conv.answers), turn.error)
            return
        if result.trace is not None:
            conv.traced.append(TracedGeneration(result.trace, tuple(prompt) + tuple(turn.token_ids)))
        conv.prompts.append(prompt)
        conv.messages = conv.messages + [self.renderer.message(turn.token_ids, self.params.stop_token_ids)]
        flawed = "hit max_new_tokens" if turn.finish == "length" else ("empty" if turn.empty else None)
        if flawed and self.policy == "drop":
            conv.stopped = f"drop: a turn {flawed}"

    def _outcome(self, prompt: list[int], result: GenerationResult) -> TurnOutcome:
        """The turn ``result`` makes: its ids cut at the first stop id and ``max_new_tokens``; refused (``failed``,
        ``malformed``) when what remains holds a structure token of the template."""
        if result.finish == "failed":
            return TurnOutcome(len(prompt), list(result.token_ids), "failed", empty=False, error=result.error)
        stop = self.params.stop_token_ids
        cut = cut_answer(list(result.token_ids), stop, self.params.max_new_tokens)
        finish: Finish = "stop" if cut.stopped else ("length" if len(cut.ids) >= self.params.max_new_tokens else result.finish)
        found = first_structure_token(cut.ids, self.structure)
        if found is not None:
            position, token = found
            kind = f"structure token {self.structure[token]}"
            error = f"{MALFORMED}: {kind} (id {token}) at position {position}, before the answer's end"
            return TurnOutcome(len(prompt), cut.ids, "failed", empty=False, error=error, cut=cut.cut, malformed=kind)
        empty = not [t for t in cut.ids if t not in stop]
        return TurnOutcome(len(prompt), cut.ids, finish, empty=empty, error=result.error, cut=cut.cut)

    def record(self, conv: Conversation) -> ConversationRecord:
        """The stored outcome of one conversation: its turns, the regenerated messages and the sample's ids and mask spans."""
        source = conv.sample.meta.get("conversation")
        record = ConversationRecord(
            sample_id=conv.sample.sample_id,
            row_index=conv.sample.meta.get("row_index"),
            turns=conv.answers,
            messages=conv.messages,
            tools=source.tools if source is not None else None,
        )
        if not conv.turns:
            return replace(record, dropped=NOT_REGENERABLE)
        if conv.stopped and conv.stopped.startswith("drop"):
            return replace(record, dropped=conv.stopped)
        if conv.stopped == MALFORMED:
            return replace(record, dropped=conv.answers[-1].error)
        if not conv.prompts:
            return replace(record, dropped="the first turn failed: " + conv.answers[-1].error)
        kept = [a.token_ids for a in conv.answers if a.finish != "failed"]
        ids, mask, supervised = assemble(conv.prompts, kept)
        return replace(record, input_ids=ids, loss_spans=_spans(mask), supervised_turns=supervised)


def _spans(mask: list[bool]) -> list[list[int]]:
    """``[start, stop)`` of every run of supervised positions."""
    spans: list[list[int]] = []
    for i, bit in enumerate(mask):
        if bit and (not spans or spans[-1][1] != i):
            spans.append([i, i + 1])
        elif bit:
            spans[-1][1] = i + 1
    return spans


def stored_record(store: RegeneratedStore, sample: TokenizedSample) -> ConversationRecord:
    """The record ``store`` holds for ``sample``, once it is shown to be of this sample's conversation.

    Why: a resumed build takes a stored record by sample id alone and captures its ids as
    they are. A record whose id is right but whose conversation is another row's (the
    source file edited or reordered between runs under position ids, or records swapped
    in the file: both hash-consistent) would be stored as this sample without a word. The
    prompts a record holds (every message but the assistant's, in order) are the source
    row's own up to its last regenerated turn, so they must equal the row's; any other
    record is refused, naming the file, the sample and the first message that differs.
    """
    record = ConversationRecord.from_json(store.get(sample.sample_id))  # type: ignore[arg-type]
    source = sample.meta.get("conversation")
    if source is not None:
        problem = _other_prompts(record.messages, source.messages)
        if problem is not None:
            raise FormatError(
                f"{store.path}: sample {sample.sample_id!r}: the stored record is of another conversation than the source row's "
                f"({problem}); the source changed since the build stored it, or the file was edited: restore the source, "
                f"or delete {store.path} to regenerate every conversation"
            )
    return record


def _prompts(messages: list[Any]) -> list[tuple[Any, Any]]:
    """(role, content) of every message that is not the assistant's: what regeneration keeps of a row as it was."""
    return [(m.get("role"), m.get("content")) if isinstance(m, dict) else (None, m) for m in messages if not _is_answer(m)]


def _is_answer(message: Any) -> bool:
    return isinstance(message, dict) and message.get("role") == "assistant"


def _other_prompts(stored: list[Any], source: list[dict[str, Any]]) -> str | None:
    """Where the stored messages' prompts stop being the source's (a prefix of them), or None when they are."""
    mine, theirs = _prompts(stored), _prompts(source)
    for k, message in enumerate(mine):
        if k >= len(theirs) or message != theirs[k]:
            given = f"{theirs[k][0]} {str(theirs[k][1])[:40]!r}" if k < len(theirs) else "none"
            return f"prompt message {k}: {message[0]} {str(message[1])[:40]!r} stored, {given} in the source"
    return None

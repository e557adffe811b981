"""One conversation's regeneration as steps a scheduler drives: its next prompt, each answer taken, its record.

The two schedulers (``windows.py`` for batch generators, ``pump.py`` for servers) decide
*when* a turn is asked for; what a turn's prompt is, what an answer does to the
conversation and what is stored at the end is decided here, once, so both store the
same records for the same answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from hs_dataset.formats.regenerated_record import NOT_REGENERABLE, ConversationRecord, TurnOutcome
from hs_dataset.regenerate.generator import ONE_PASS_META, GenerationParams, GenerationResult, TracedGeneration
from hs_dataset.regenerate.turns import TurnRenderer, assemble, regenerable_turns, splice
from hs_dataset.sample import TokenizedSample
from hs_dataset.sources.report import MalformedRowError
from hs_dataset.sources.template_guard import RowBudget

__all__ = ["Conversation", "Finished", "TurnRules"]

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
    """What a turn is and what its answer does: the renderer, the generation parameters, the drop policy, the turn limit."""

    renderer: TurnRenderer
    params: GenerationParams
    policy: str = "keep"
    turn_limit: int | None = None

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
        """The answer to ``prompt``: kept as the next turn, or the end of the conversation (failed, or dropped by policy)."""
        stop = self.params.stop_token_ids
        body = [t for t in result.token_ids if t not in stop]
        turn = TurnOutcome(
            prompt_tokens=len(prompt),
            token_ids=list(result.token_ids),
            finish=result.finish,
            empty=not body and result.finish != "failed",
            error=result.error,
        )
        conv.answers.append(turn)
        if result.finish == "failed":
            conv.stopped = "failed"
            return
        if result.trace is not None:
            conv.traced.append(TracedGeneration(result.trace, tuple(prompt) + tuple(result.token_ids)))
        conv.prompts.append(prompt)
        conv.messages = conv.messages + [self.renderer.message(result.token_ids, stop)]
        flawed = "hit max_new_tokens" if result.finish == "length" else ("empty" if turn.empty else None)
        if flawed and self.policy == "drop":
            conv.stopped = f"drop: a turn {flawed}"

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

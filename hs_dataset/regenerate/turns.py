"""Assistant turns for regeneration: the prompt of each turn, and the sample the answers make.

The target writes assistant turn ``k`` after the prompt the chat template renders for
everything before it (``add_generation_prompt=True``), with the turns it already
rewrote as context. The captured sample is the last turn's prompt followed by exactly
the ids the model wrote for it, so nothing the model wrote is re-tokenized. The loss
mask covers exactly the generated ids: the last turn's by construction, each earlier
turn's where the template rendered it back verbatim (the next prompt holds that
turn's prompt and then its ids at the same place). A template that rewrites history
(Kimi drops earlier turns' reasoning) leaves such turns unsupervised, and they are
counted, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hs_dataset.sources.chat import ChatTokenizer
from hs_dataset.sources.messages import Conversation
from hs_dataset.sources.template_guard import RowBudget

__all__ = ["TurnRenderer", "assemble", "regenerable_turns", "splice"]

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


def regenerable_turns(conv: Conversation, limit: int | None) -> list[int]:
    """Indexes of the assistant messages to rewrite, in order.

    Stops before the first assistant message with tool calls: its tool results answer
    the original calls, which a rewritten turn would not make.
    """
    out: list[int] = []
    for i, message in enumerate(conv.messages):
        if message["role"] != "assistant":
            continue
        if message.get("tool_calls") or (limit is not None and len(out) >= limit):
            break
        out.append(i)
    return out


@dataclass
class TurnRenderer:
    """Render generation prompts with the chat's template, and turn generated ids back into a message."""

    chat: ChatTokenizer
    thinking: bool | None = None

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, budget: RowBudget | None = None) -> list[int]:
        """Token ids of ``messages`` followed by the template's assistant header (what the model continues)."""
        return self.render_ids(messages, tools, generation_prompt=True, budget=budget)

    def render_ids(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        generation_prompt: bool,
        budget: RowBudget | None = None,
    ) -> list[int]:
        """Token ids the template renders for ``messages`` (with or without the assistant header); ``budget``: the
        conversation's template time, shared by all of its turns' renders."""
        kwargs: dict[str, Any] = {}
        if self.thinking is not None:
            kwargs["thinking"] = self.thinking
        if self.chat.sanitizes and self.chat.may_need_sanitizing(messages, tools):
            kwargs["sanitize_control_tokens"] = True
        out = self.chat.apply(messages, tools, what="a generation prompt", budget=budget, add_generation_prompt=generation_prompt, **kwargs)
        return list(out["input_ids"])

    def message(self, generated: list[int], stop_ids: tuple[int, ...]) -> dict[str, Any]:
        """The assistant message the ids spell: reasoning before ``</think>``, the answer after it."""
        ids = generated[:-1] if generated and generated[-1] in stop_ids else generated
        text = self.chat.tokenizer.decode(ids, skip_special_tokens=False)
        if _THINK_CLOSE not in text:
            return {"role": "assistant", "content": text}
        reasoning, content = text.split(_THINK_CLOSE, 1)
        reasoning = reasoning[len(_THINK_OPEN) :] if reasoning.startswith(_THINK_OPEN) else reasoning
        return {"role": "assistant", "content": content, "reasoning_content": reasoning}


def splice(previous: list[int], answer: list[int], rendered_history: list[int], fresh: list[int], end_id: int) -> list[int] | None:
    """The next prompt with the model's own ids for the turn it just wrote, or None if the template rewrites history.

    ``rendered_history``: the template's ids for the conversation through that turn;
    ``fresh``: its ids for the next prompt. Where ``fresh`` starts with the history, the
    rest is what the next turn adds; it follows ``previous + answer`` (plus ``end_id``
    when the answer was cut before its end-of-turn token), so decoding and re-encoding
    the answer never changes its ids.
    """
    if fresh[: len(rendered_history)] != rendered_history:
        return None
    tail = [] if answer and answer[-1] == end_id else [end_id]
    return previous + answer + tail + fresh[len(rendered_history) :]


def assemble(prompts: list[list[int]], generated: list[list[int]]) -> tuple[list[int], list[bool], list[bool]]:
    """(ids, loss mask, which turns are supervised) for turns whose prompts and answers are given in order.

    ids = the last prompt + the last answer; a turn is supervised where its prompt is a
    prefix of ids and its answer follows verbatim.
    """
    if not prompts or len(prompts) != len(generated):
        raise ValueError("assemble needs one answer per prompt, at least one")
    ids = prompts[-1] + generated[-1]
    mask = [False] * len(ids)
    verbatim: list[bool] = []
    for prompt, answer in zip(prompts, generated):
        start, stop = len(prompt), len(prompt) + len(answer)
        same = ids[:start] == prompt and ids[start:stop] == answer
        verbatim.append(same)
        if same:
            mask[start:stop] = [True] * (stop - start)
    return ids, mask, verbatim

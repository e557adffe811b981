"""The regeneration stage of a build: every assistant turn rewritten by the target before capture.

Samples arrive in source order and are taken in fixed windows of ``regenerate.concurrency``
conversations. Turn ``k`` of every conversation in a window goes to the generator in one
call, for k = 1, 2, ...; the window's records are stored (``formats/regenerated.py``)
before any of its samples goes on to capture, so a killed build resumes from the stored
windows and regenerates only a window that was not stored whole, with the same batch.
The generator (``session.make_generator``) is the capture backend's own model
(in-process) or its SGLang servers.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Iterator

from hs_dataset.config import Card
from hs_dataset.faults import crash_point
from hs_dataset.formats.regenerated import RegeneratedStore
from hs_dataset.regenerate.generator import GenerationParams, GenerationResult, Generator
from hs_dataset.regenerate.records import NOT_REGENERABLE, ConversationRecord, RegenerationReport, TurnOutcome
from hs_dataset.regenerate.turns import TurnRenderer, assemble, regenerable_turns, splice
from hs_dataset.sample import TokenizedSample
from hs_dataset.sources.chat import ChatTokenizer
from hs_dataset.sources.masking import resolve_mask_rule
from hs_dataset.sources.report import MalformedRowError
from hs_dataset.sources.template_guard import RowBudget

__all__ = ["Regeneration"]


def _stop_ids(chat: ChatTokenizer, tokenizer: Any) -> tuple[int, ...]:
    """End-of-turn ids: the mask rule's end token (``<|im_end|>``) and the tokenizer's EOS."""
    ids = [getattr(getattr(chat, "_compiled", None), "end_id", None), tokenizer.eos_token_id]
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None))


@dataclass
class _Conversation:
    """One conversation while its window is regenerated: the turns to rewrite and what was written so far."""

    sample: TokenizedSample
    turns: list[int]  # indexes of the assistant messages to rewrite
    messages: list[dict[str, Any]] = field(default_factory=list)  # the context so far, rewritten turns included
    pos: int = 0  # source messages consumed
    prompts: list[list[int]] = field(default_factory=list)
    answers: list[TurnOutcome] = field(default_factory=list)
    stopped: str | None = None
    budget: RowBudget | None = None  # the conversation's template time, across all of its turns


class Regeneration:
    """One build's regeneration: generator, template, parameters, the stored records and the counts."""

    def __init__(self, card: Card, generator: Generator, tokenizer: Any, out_dir: Path, name: str) -> None:
        section = card.regenerate
        chat = ChatTokenizer(tokenizer, resolve_mask_rule(tokenizer), limits=card.limits)
        self.generator = generator
        self.section = section
        self.params = GenerationParams(
            max_new_tokens=section.max_new_tokens, temperature=section.temperature, top_p=section.top_p,
            seed=section.seed, stop_token_ids=_stop_ids(chat, tokenizer),
        )
        self.renderer = TurnRenderer(chat, None if section.thinking is None else section.thinking == "on")
        self.store = RegeneratedStore(out_dir, name)
        self.report = RegenerationReport()
        self.max_length = card.max_length

    def metadata(self) -> dict[str, Any]:
        """Generation parameters, engine and model, for the manifest and the dataset card."""
        s = self.section
        return {
            "file": self.store.name, **self.params.to_json(), "thinking": s.thinking, "turns": s.turns, "policy": s.policy,
            "concurrency": s.concurrency, "generator": self.generator.describe(),
        }

    def close(self) -> None:
        if hasattr(self.generator, "close"):
            self.generator.close()

    # ------------------------------------------------------------------ the stage
    def regenerate(self, windows: Iterable[list[TokenizedSample]]) -> Iterator[TokenizedSample]:
        """Replace each conversation's assistant turns with the target's own, window by window.

        ``windows``: fixed windows of the source order, ``regenerate.concurrency`` samples
        each, so a resumed build forms the same windows (and batches) as before.
        """
        for window in windows:
            missing = [s for s in window if self.store.get(s.sample_id) is None]
            if missing:
                self.store.append_chunk([record.to_json() for record in self._regenerate_window(missing)])
                crash_point("regenerate.after_chunk")
            self.report.from_store += len(window) - len(missing)
            for sample in window:
                record = ConversationRecord.from_json(self.store.get(sample.sample_id))
                self.report.count(record)
                out = self._sample_from_record(sample, record)
                if out is not None:
                    yield out

    def _regenerate_window(self, window: list[TokenizedSample]) -> list[ConversationRecord]:
        """Turn k of every conversation of the window in one generate call, for k = 1, 2, ..."""
        convs = []
        for sample in window:
            conv = sample.meta.get("conversation")
            convs.append(_Conversation(
                sample, regenerable_turns(conv, self.section.turns) if conv is not None else [], budget=RowBudget(self.renderer.chat.limits),
            ))
        for k in itertools.count():
            active = [c for c in convs if c.stopped is None and k < len(c.turns)]
            if not active:
                break
            prompts = [self._next_prompt(c) for c in active]
            ready = [(c, p) for c, p in zip(active, prompts) if p is not None]
            results = self.generator.generate([p for _, p in ready], self.params)
            for (conv, prompt), result in zip(ready, results):
                self._take_turn(conv, prompt, result)
        return [self._record(c) for c in convs]

    def _next_prompt(self, conv: _Conversation) -> list[int] | None:
        """The prompt of the conversation's next turn (None: the template refused it, which ends the conversation)."""
        source = conv.sample.meta["conversation"]
        index = conv.turns[len(conv.prompts)]
        context = conv.messages + source.messages[conv.pos:index]
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

    def _spliced(self, conv: _Conversation, fresh: list[int], tools: Any) -> list[int] | None:
        """The next prompt holding the previous turn's ids as the model wrote them (None: the template rewrote it)."""
        history = self.renderer.render_ids(conv.messages, tools, generation_prompt=False, budget=conv.budget)
        answer = conv.answers[-1].token_ids
        stop = self.params.stop_token_ids
        end_id = next((t for t in stop if answer and t == answer[-1]), stop[0])
        return splice(conv.prompts[-1], answer, history, fresh, end_id)

    def _take_turn(self, conv: _Conversation, prompt: list[int], result: GenerationResult) -> None:
        stop = self.params.stop_token_ids
        body = [t for t in result.token_ids if t not in stop]
        turn = TurnOutcome(
            prompt_tokens=len(prompt), token_ids=list(result.token_ids), finish=result.finish,
            empty=not body and result.finish != "failed", error=result.error,
        )
        conv.answers.append(turn)
        if result.finish == "failed":
            conv.stopped = "failed"
            return
        conv.prompts.append(prompt)
        conv.messages = conv.messages + [self.renderer.message(result.token_ids, stop)]
        flawed = "hit max_new_tokens" if result.finish == "length" else ("empty" if turn.empty else None)
        if flawed and self.section.policy == "drop":
            conv.stopped = f"drop: a turn {flawed}"

    def _record(self, conv: _Conversation) -> ConversationRecord:
        """The stored outcome of one conversation: its turns, the regenerated messages and the sample's ids and mask spans."""
        source = conv.sample.meta.get("conversation")
        record = ConversationRecord(
            sample_id=conv.sample.sample_id, row_index=conv.sample.meta.get("row_index"), turns=conv.answers,
            messages=conv.messages, tools=source.tools if source is not None else None,
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

    def _sample_from_record(self, sample: TokenizedSample, record: ConversationRecord) -> TokenizedSample | None:
        """The sample to capture: the regenerated ids cut to ``max_length``, the source sample, or None (dropped)."""
        import torch

        if record.input_ids is None:
            if record.not_regenerable:
                self.report.not_regenerable += 1
                return sample
            return None
        ids = record.input_ids
        mask = [False] * len(ids)
        for start, stop in record.loss_spans:
            mask[start:stop] = [True] * (stop - start)
        full = len(ids)
        ids, mask = ids[: self.max_length], mask[: self.max_length]
        if not any(mask):
            self.report.cut_by_max_length += 1
            return None
        meta = {k: v for k, v in sample.meta.items() if k != "conversation"}
        meta.update(format="regenerated", full_length=full)
        return TokenizedSample(
            sample_id=sample.sample_id, input_ids=torch.tensor(ids, dtype=torch.int64),
            loss_mask=torch.tensor(mask, dtype=torch.bool), truncated=full > self.max_length, meta=meta,
        )

    # ------------------------------------------------------------------ the manifest
    def record_file(self, out_dir: Path) -> None:
        """Hash the regenerated-conversations file into the manifest (``metadata.regeneration.files``)."""
        from hs_dataset.formats.dirlock import acquire_dir_lock, release_dir_lock
        from hs_dataset.formats.manifest import Manifest

        fd = acquire_dir_lock(out_dir)
        try:
            manifest = Manifest.load(out_dir)
            entry = dict(manifest.metadata.get("regeneration") or self.metadata())
            files = dict(entry.get("files") or {})
            files[self.store.name] = {"sha256": self.store.sha256(), "records": len(self.store.records)}
            entry["files"] = files
            manifest.metadata["regeneration"] = entry
            manifest.save(out_dir)
        finally:
            release_dir_lock(fd)


def _spans(mask: list[bool]) -> list[list[int]]:
    """``[start, stop)`` of every run of supervised positions."""
    spans: list[list[int]] = []
    for i, bit in enumerate(mask):
        if bit and (not spans or spans[-1][1] != i):
            spans.append([i, i + 1])
        elif bit:
            spans[-1][1] = i + 1
    return spans

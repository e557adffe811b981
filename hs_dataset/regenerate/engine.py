"""The regeneration stage of a build: every assistant turn rewritten by the target before capture.

Samples arrive in source order; each comes out as the sample to capture over its
regenerated conversation, once that conversation's record is stored
(``formats/regenerated.py``). How turns are scheduled follows the generator
(the capture backend's ``generator``): the in-process model answers fixed windows of the source
order, turn k of a window together (``windows.py``), so a resumed build writes the same
turns; SGLang servers are kept busy by a pump that carries ``in_flight`` conversations at
once and hands each on to capture as it finishes (``pump.py``), in groups that fill one prefill
batch of the servers, so capture does not pause their decoding once per sample. Either way a killed
build resumes from the stored records and never regenerates a stored conversation.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from hs_dataset.config import Card
from hs_dataset.formats.metadata import RegeneratedFile, RegenerationRecord
from hs_dataset.formats.regenerated import RegeneratedStore
from hs_dataset.formats.regenerated_record import ConversationRecord
from hs_dataset.formats.writer import ShardWriter
from hs_dataset.regenerate.answers import structure_tokens
from hs_dataset.regenerate.conversation import Finished, TurnRules
from hs_dataset.regenerate.generator import GenerationParams, Generator, StreamingGenerator
from hs_dataset.regenerate.progress import RegenerationProgress
from hs_dataset.regenerate.pump import ConversationPump
from hs_dataset.regenerate.report import RegenerationReport
from hs_dataset.regenerate.turns import TurnRenderer
from hs_dataset.regenerate.windows import regenerate_in_windows
from hs_dataset.sample import TokenizedSample, bursts
from hs_dataset.sources.chat import ChatTokenizer
from hs_dataset.sources.masking import resolve_mask_rule

__all__ = ["DEFAULT_BATCH_ROWS", "Regeneration"]

DEFAULT_BATCH_ROWS = 16  # conversations per window of a batch generator when the card sets no regenerate.concurrency


def _stop_ids(chat: ChatTokenizer, tokenizer: Any) -> tuple[int, ...]:
    """End-of-turn ids: the mask rule's end token (``<|im_end|>``) and the tokenizer's EOS."""
    ids = [chat.end_of_turn_id, tokenizer.eos_token_id]
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None))


class Regeneration:
    """One build's regeneration: generator, turn rules, the stored records and the counts."""

    def __init__(
        self,
        card: Card,
        generator: Generator,
        tokenizer: Any,
        out_dir: Path,
        name: str,
        burst: tuple[int, int] | None = None,
        vocab_size: int | None = None,
    ) -> None:
        """``burst``: (tokens, samples) finished conversations gather to before going on to capture (``sample.bursts``).

        ``vocab_size``: the vocabulary the manifest records (the model's, else the tokenizer's; the bound ``verify``
        checks the file against); the records a resumed build reads back are checked against it, since they are
        captured as stored.
        """
        section = card.regenerate
        self.burst = burst
        chat = ChatTokenizer(tokenizer, resolve_mask_rule(tokenizer), limits=card.limits)
        self.generator = generator
        self.section = section
        self.params = GenerationParams(
            max_new_tokens=section.max_new_tokens,
            temperature=section.temperature,
            top_p=section.top_p,
            seed=section.seed,
            stop_token_ids=_stop_ids(chat, tokenizer),
        )
        renderer = TurnRenderer(chat, None if section.thinking is None else section.thinking == "on")
        structure = structure_tokens(chat, self.params.stop_token_ids)
        self.rules = TurnRules(renderer, self.params, policy=section.policy, turn_limit=section.turns, structure=structure)
        self.store = RegeneratedStore(out_dir, name, vocab_size=vocab_size)
        self.report = RegenerationReport()
        self.max_length = card.max_length

    def record(self) -> RegenerationRecord:
        """Generation parameters, engine and model, for the manifest and the dataset card."""
        s, p = self.section, self.params
        return RegenerationRecord(
            file=self.store.name,
            max_new_tokens=p.max_new_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            seed=p.seed,
            stop_token_ids=tuple(p.stop_token_ids),
            structure_token_ids=tuple(sorted(self.rules.structure)),
            thinking=s.thinking,
            turns=s.turns,
            policy=s.policy,
            concurrency=s.concurrency,
            generator=self.generator.describe(),
        )

    def close(self) -> None:
        if hasattr(self.generator, "close"):
            self.generator.close()

    # ------------------------------------------------------------------ the stage
    def regenerate(self, samples: Iterable[TokenizedSample], progress: RegenerationProgress | None = None) -> Iterator[TokenizedSample]:
        """Replace each conversation's assistant turns with the target's own; yield the samples to capture."""
        on_tokens = progress.generated if progress is not None else (lambda n: None)
        finished: Iterator[Finished]
        if isinstance(self.generator, StreamingGenerator):
            finished = ConversationPump(self.generator, self.rules, self.store, self.generator.in_flight, on_tokens).run(samples)
        else:
            rows = self.section.concurrency or DEFAULT_BATCH_ROWS
            finished = regenerate_in_windows(samples, rows, self.generator, self.rules, self.store, on_tokens)
        captured = self._to_capture(finished, progress)
        if self.burst is not None:
            captured = bursts(captured, *self.burst)
        yield from captured

    def _to_capture(self, finished: Iterable[Finished], progress: RegenerationProgress | None) -> Iterator[TokenizedSample]:
        for sample, record, fresh in finished:
            self.report.count(record, fresh)
            if progress is not None:
                progress.conversation_done(fresh)
            out = self._sample_from_record(sample, record)
            if out is not None:
                yield out

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
            sample_id=sample.sample_id,
            input_ids=torch.tensor(ids, dtype=torch.int64),
            loss_mask=torch.tensor(mask, dtype=torch.bool),
            truncated=full > self.max_length,
            meta=meta,
        )

    # ------------------------------------------------------------------ the manifest
    def record_file(self, writer: ShardWriter) -> None:
        """Have the writer hash the regenerated-conversations file into the manifest (``metadata.regeneration.files``).

        Called once every conversation is stored, before the writer closes: the writer owns the manifest.
        """
        entry = RegeneratedFile(sha256=self.store.sha256(), records=len(self.store))
        writer.record_regenerated_file(self.store.name, entry, regeneration=self.record())

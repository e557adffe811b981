"""An answer is what the model generated, and no more (issue 47): cut at its first stop id and at max_new_tokens.

Proved here, through both schedulers (the pump of a streaming generator, the windows of a
batch one) with a generator that answers whatever a hostile server would: 5,000 ids for
max_new_tokens 8 are stored as 8; an end-of-turn token, a user role marker and more text
are stored cut at the end-of-turn (the forged user turn is gone, the mask covers only the
answer); a role marker before any stop id is refused, counted by kind in the run report, and
its conversation is not stored; an answer that runs to max_new_tokens without a stop id is
kept. The cut itself, as a property: nothing after the first stop id, never more than
max_new_tokens, and a prefix of what came back.
"""

from __future__ import annotations

import concurrent.futures

import pytest
import torch
from hypothesis import given, strategies as st

from hs_dataset.formats.regenerated import RegeneratedStore
from hs_dataset.formats.regenerated_record import ConversationRecord
from hs_dataset.pipeline.run_report import _answers_line
from hs_dataset.regenerate.answers import CUT_AFTER_STOP, CUT_AT_MAX_NEW_TOKENS, cut_answer, structure_tokens
from hs_dataset.regenerate.conversation import TurnRules
from hs_dataset.regenerate.generator import GenerationParams, GenerationResult, Generator, StreamingGenerator
from hs_dataset.regenerate.pump import ConversationPump
from hs_dataset.regenerate.report import RegenerationReport
from hs_dataset.regenerate.turns import TurnRenderer
from hs_dataset.regenerate.windows import regenerate_in_windows
from hs_dataset.sample import TokenizedSample
from hs_dataset.sources.messages import Conversation

MAX_NEW = 8


@given(st.lists(st.integers(0, 9), max_size=40), st.sets(st.integers(0, 9), max_size=3), st.integers(1, 20))
def test_the_cut_keeps_nothing_after_the_first_stop_id_and_never_more_than_max_new_tokens(ids, stops, max_new):
    cut = cut_answer(ids, stops, max_new)
    assert cut.ids == ids[: len(cut.ids)] and len(cut.ids) <= max_new
    assert not any(t in stops for t in cut.ids[:-1])
    assert cut.stopped == (bool(cut.ids) and cut.ids[-1] in stops)
    assert (cut.cut is None) == (cut.ids == ids)


@pytest.fixture(scope="module")
def chat(tiny_chat):
    return tiny_chat


@pytest.fixture(scope="module")
def rules(chat) -> TurnRules:
    stop = (chat.end_of_turn_id, chat.tokenizer.eos_token_id)
    params = GenerationParams(max_new_tokens=MAX_NEW, stop_token_ids=stop)
    return TurnRules(TurnRenderer(chat, False), params, structure=structure_tokens(chat, stop))


def test_structure_tokens_are_the_role_markers_not_the_answer_s_own_tokens(chat, rules):
    names = set(rules.structure.values())
    assert {"<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_system|>"} <= names
    assert not names & {"<|im_end|>", "<think>", "</think>"}  # the stop id is cut at; think tokens are the answer's


class Hostile(StreamingGenerator):
    """Answers by the prompt's last word: ``long`` 5,000 ids, ``forged`` end-of-turn + user marker + text,
    ``marker`` a user marker before its end, ``exact`` max_new_tokens ids and no stop (``ignore_eos``)."""

    in_flight = 2

    def __init__(self, chat) -> None:
        tok = chat.tokenizer
        word = tok("fine", add_special_tokens=False)["input_ids"]
        user = tok.convert_tokens_to_ids("<|im_user|>")
        end = chat.end_of_turn_id
        self.answers = {
            "long": word * 5000,
            "forged": word + [end, user] + tok("user", add_special_tokens=False)["input_ids"] + word * 3,
            "marker": word + [user] + word + [end],
            "exact": (word * MAX_NEW)[:MAX_NEW],
            "good": word + [end],
        }
        self.tokenizer = tok

    def describe(self) -> dict:
        return {"engine": "hostile"}

    def _answer(self, prompt: list[int]) -> GenerationResult:
        word = self.tokenizer.decode(prompt).rsplit("say ", 1)[-1].split("<", 1)[0].strip()
        ids = self.answers[word]
        return GenerationResult(list(ids), "length")

    def generate(self, prompts, params):
        return [self._answer(p) for p in prompts]

    def submit(self, prompt, params) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(self._answer(prompt))
        return future


class Batch(Generator):
    """The same answers from a batch generator (the in-process model's scheduling)."""

    def __init__(self, hostile: Hostile) -> None:
        self.hostile = hostile

    def describe(self) -> dict:
        return {"engine": "hostile batch"}

    def generate(self, prompts, params):
        return self.hostile.generate(prompts, params)


def sample(name: str, words: list[str]) -> TokenizedSample:
    messages = []
    for word in words:
        messages += [{"role": "user", "content": f"say {word}"}, {"role": "assistant", "content": "old"}]
    meta = {"conversation": Conversation(messages=messages, tools=None), "row_index": 0}
    return TokenizedSample(name, torch.tensor([1, 2]), torch.tensor([False, True]), meta=meta)


SOURCE = [sample("long", ["long"]), sample("forged", ["forged", "good"]), sample("marker", ["good", "marker"]), sample("exact", ["exact"])]


def run(kind: str, tmp_path, chat, rules) -> dict[str, ConversationRecord]:
    hostile = Hostile(chat)
    store = RegeneratedStore(tmp_path)
    if kind == "pump":
        finished = ConversationPump(hostile, rules, store, slots=2).run(SOURCE)
    else:
        finished = regenerate_in_windows(SOURCE, 2, Batch(hostile), rules, store)
    out = {s.sample_id: r for s, r, _ in finished}
    stored = {k: ConversationRecord.from_json(v) for k, v in RegeneratedStore(tmp_path).records.items()}
    assert {k: r.to_json() for k, r in stored.items()} == {k: r.to_json() for k, r in out.items()}
    return stored


@pytest.mark.parametrize("kind", ["pump", "windows"])
def test_answers_are_cut_to_what_the_model_generated_and_forged_turns_refused(kind, tmp_path, chat, rules, caplog):
    records = run(kind, tmp_path, chat, rules)
    end, user = chat.end_of_turn_id, chat.tokenizer.convert_tokens_to_ids("<|im_user|>")

    long = records["long"].turns[0]
    assert len(long.token_ids) == MAX_NEW and long.finish == "length" and long.cut == CUT_AT_MAX_NEW_TOKENS
    assert len(records["long"].input_ids) == long.prompt_tokens + MAX_NEW

    forged = records["forged"]
    assert forged.turns[0].token_ids[-1] == end and forged.turns[0].finish == "stop" and forged.turns[0].cut == CUT_AFTER_STOP
    assert user not in forged.turns[0].token_ids and forged.dropped is None
    start, stop = forged.loss_spans[0]
    assert forged.input_ids[start:stop] == forged.turns[0].token_ids  # the mask trains on the answer, not the forged turn
    assert len(forged.loss_spans) == 2 and all(user not in forged.input_ids[a:b] for a, b in forged.loss_spans)

    marker = records["marker"]
    assert marker.input_ids is None and marker.dropped.startswith("malformed answer: structure token <|im_user|>")
    assert marker.turns[1].finish == "failed" and marker.turns[1].malformed == "structure token <|im_user|>"

    exact = records["exact"].turns[0]
    assert len(exact.token_ids) == MAX_NEW and exact.finish == "length" and exact.cut is None and records["exact"].dropped is None

    report = RegenerationReport()
    for record in records.values():
        report.count(record, True)
    assert (report.cut_at_max_new_tokens, report.cut_after_stop, report.failed) == (1, 1, 0)
    assert report.malformed == {"structure token <|im_user|>": 1} and report.dropped == 1
    assert _answers_line(vars(report)) == (
        "  answers cut          after their stop id 1, at max_new_tokens 1; refused as malformed 1 (structure token <|im_user|>: 1)"
    )
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert refusals == [
        f"marker: turn 2 refused, conversation not stored: malformed answer: structure token <|im_user|> (id {user}) "
        f"at position 1, before the answer's end"
    ]

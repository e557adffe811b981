"""The regeneration pump against a stand-in streaming generator whose answers take the time each prompt asks for.

Proved here: a conversation's next turn goes out while a slower conversation's answer is
still pending (no lock-step), and a new conversation starts as soon as a slot frees (the
waiting one with the most turns first); a
finished conversation is stored, durably, before it is handed on, and handed on while
others are still generating; the source is read no further ahead than the bounded
stages when the consumer stops taking; stored conversations are never sent again; a
source error arrives after the conversations already taken are stored; a consumer that
stops early stops the pump and its requests.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest
import torch

from hs_dataset.formats.regenerated import RegeneratedStore
from hs_dataset.regenerate.conversation import TurnRules
from hs_dataset.regenerate.generator import GenerationParams, GenerationResult, StreamingGenerator
from hs_dataset.regenerate.pump import ConversationPump
from hs_dataset.regenerate.turns import TurnRenderer
from hs_dataset.sample import TokenizedSample
from hs_dataset.sources.messages import Conversation

SLOW_S, FAST_S = 0.8, 0.01


class StandIn(StreamingGenerator):
    """Answers after ``SLOW_S`` when the prompt says "slow", else ``FAST_S``; logs every submit and answer."""

    def __init__(self, tokenizer, in_flight: int) -> None:
        self.tokenizer = tokenizer
        self.in_flight = in_flight
        self.pool = concurrent.futures.ThreadPoolExecutor(64)
        self.lock = threading.Lock()
        self.pending = 0
        self.most = 0
        self.log: list[tuple[float, str, str]] = []  # (time, "ask" | "answer", the last user message's word)
        self.answer = tokenizer("fine", add_special_tokens=False)["input_ids"]

    def describe(self) -> dict:
        return {"engine": "stand-in"}

    def generate(self, prompts, params):
        return [self.submit(p, params).result() for p in prompts]

    def submit(self, prompt, params) -> concurrent.futures.Future:
        word = self.tokenizer.decode(prompt).rsplit("say ", 1)[-1].split("<", 1)[0].strip()
        with self.lock:
            self.pending += 1
            self.most = max(self.most, self.pending)
            self.log.append((time.monotonic(), "ask", word))

        def answer() -> GenerationResult:
            time.sleep(SLOW_S if word.startswith("slow") else FAST_S)
            with self.lock:
                self.pending -= 1
                self.log.append((time.monotonic(), "answer", word))
            return GenerationResult(list(self.answer), "length")

        return self.pool.submit(answer)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir), local_files_only=True)


@pytest.fixture(scope="module")
def rules(tokenizer) -> TurnRules:
    from hs_dataset.sources.chat import ChatTokenizer
    from hs_dataset.sources.masking import resolve_mask_rule

    chat = ChatTokenizer(tokenizer, resolve_mask_rule(tokenizer))
    stop = chat.end_of_turn_id
    return TurnRules(TurnRenderer(chat, False), GenerationParams(max_new_tokens=4, stop_token_ids=(stop,)))


def sample(name: str, words: list[str]) -> TokenizedSample:
    """A conversation with one user turn per word ("say <word>"), each answered (the answers are rewritten)."""
    messages = []
    for word in words:
        messages += [{"role": "user", "content": f"say {word}"}, {"role": "assistant", "content": "old"}]
    meta = {"conversation": Conversation(messages=messages, tools=None), "row_index": 0}
    return TokenizedSample(name, torch.tensor([1, 2]), torch.tensor([False, True]), meta=meta)


def test_turns_flow_without_lock_step_and_a_freed_slot_starts_the_next_conversation(tmp_path, tokenizer, rules):
    generator = StandIn(tokenizer, 2)
    source = [sample("slow", ["slow"]), sample("multi", ["one", "two", "three"]), sample("next", ["four"])]
    store = RegeneratedStore(tmp_path)
    out = list(ConversationPump(generator, rules, store, slots=2).run(source))
    assert sorted(s.sample_id for s, _, fresh in out if fresh) == ["multi", "next", "slow"]
    events = [(what, word) for _, what, word in generator.log]
    slow_answer = events.index(("answer", "slow"))
    # the three turns of "multi" and the whole of "next" were asked and answered while "slow" was pending
    for word in ("one", "two", "three", "four"):
        assert events.index(("answer", word)) < slow_answer, events
    assert events.index(("ask", "two")) > events.index(("answer", "one"))  # turns in order, each after the previous answer
    assert generator.most == 2
    assert [s.sample_id for s, _, _ in out][-1] == "slow"


def test_a_free_slot_takes_the_waiting_conversation_with_the_most_turns(tmp_path, tokenizer, rules):
    generator = StandIn(tokenizer, 1)
    source = [sample("first", ["slow"]), sample("short", ["five"]), sample("long", ["one", "two", "three"])]
    out = list(ConversationPump(generator, rules, RegeneratedStore(tmp_path), slots=1).run(source))
    assert [s.sample_id for s, _, _ in out] == ["first", "long", "short"]
    assert [word for _, what, word in generator.log if what == "ask"] == ["slow", "one", "two", "three", "five"]


def test_a_finished_conversation_is_stored_before_it_is_handed_on_while_others_generate(tmp_path, tokenizer, rules):
    generator = StandIn(tokenizer, 2)
    source = [sample("slow", ["slow"]), sample("fast", ["fast"])]
    stream = ConversationPump(generator, rules, RegeneratedStore(tmp_path), slots=2).run(source)
    first, record, fresh = next(stream)
    assert first.sample_id == "fast" and fresh
    reopened = RegeneratedStore(tmp_path)  # on disk, fsynced, as a killed build would find it
    assert "fast" in reopened and reopened.get("fast") == record.to_json()
    assert generator.pending == 1, "capture of the first conversation would have waited for the slow one"
    assert [s.sample_id for s, _, _ in stream] == ["slow"]


def test_the_source_is_read_no_further_than_the_bounded_stages(tmp_path, tokenizer, rules):
    drawn = []

    def source():
        for k in range(1000):
            drawn.append(k)
            yield sample(f"c{k}", ["fast"])

    slots = 4
    stream = ConversationPump(StandIn(tokenizer, slots), rules, RegeneratedStore(tmp_path), slots=slots).run(source())
    next(stream)
    time.sleep(1.0)  # the consumer (capture) stops taking
    # todo (2 x slots) + slots + finished + the line being stored + ready (slots each), and one held by each blocked put
    assert len(drawn) <= 6 * slots + 4, len(drawn)
    stream.close()


def test_stored_conversations_are_never_sent_again(tmp_path, tokenizer, rules):
    store = RegeneratedStore(tmp_path)
    first = list(ConversationPump(StandIn(tokenizer, 3), rules, store, slots=3).run([sample(f"c{k}", ["a", "b"]) for k in range(5)]))
    generator = StandIn(tokenizer, 3)
    again = list(
        ConversationPump(generator, rules, RegeneratedStore(tmp_path), slots=3).run([sample(f"c{k}", ["a", "b"]) for k in range(7)])
    )
    assert sorted(s.sample_id for s, _, fresh in again if not fresh) == [f"c{k}" for k in range(5)]
    assert sorted(s.sample_id for s, _, fresh in again if fresh) == ["c5", "c6"]
    assert len([e for e in generator.log if e[1] == "ask"]) == 4  # two turns each of c5 and c6, nothing else
    before = {s.sample_id: r for s, r, _ in first}
    assert all(r == before[s.sample_id] for s, r, fresh in again if not fresh)


def test_a_source_error_arrives_after_the_conversations_taken_are_stored(tmp_path, tokenizer, rules):
    def source():
        yield sample("a", ["one"])
        yield sample("b", ["two"])
        raise ValueError("row 3 is broken")

    got = []
    with pytest.raises(ValueError, match="row 3"):
        for s, _, _ in ConversationPump(StandIn(tokenizer, 2), rules, RegeneratedStore(tmp_path), slots=2).run(source()):
            got.append(s.sample_id)
    assert sorted(got) == ["a", "b"] and "a" in RegeneratedStore(tmp_path) and "b" in RegeneratedStore(tmp_path)


def test_a_consumer_that_stops_early_stops_the_pump(tmp_path, tokenizer, rules):
    generator = StandIn(tokenizer, 3)
    stream = ConversationPump(generator, rules, RegeneratedStore(tmp_path), slots=3).run(
        [sample(f"c{k}", ["fast"]) for k in range(2)] + [sample(f"s{k}", ["slow"]) for k in range(20)]
    )
    next(stream)
    stream.close()
    assert not any(t.name == "hs-regenerate" and t.is_alive() for t in threading.enumerate())
    asked = len([e for e in generator.log if e[1] == "ask"])
    time.sleep(SLOW_S + 0.2)
    assert len([e for e in generator.log if e[1] == "ask"]) == asked, "requests were sent after the consumer stopped"

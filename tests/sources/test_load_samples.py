"""The sources stage on the real tiny tokenizer (DeepSeek-V3 vocab + Kimi-K2.5-shaped template).

Masks are checked by decoding the supervised spans back to text and comparing them
with what each assistant message should contribute, so a mask that is off by one
token, leaks into a tool result or misses the end token fails loudly.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import datasets
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from hs_dataset.demo.tiny_tokenizer import KIMI_CHAT_TOKENS, TINY_VOCAB_LIMIT, write_tiny_tokenizer
from hs_dataset.errors import SourceError
from hs_dataset.sources import (
    MarkerSpanRule,
    SampleRules,
    SourceReport,
    bundled_conversations_path,
    iter_samples,
    load_samples,
)

# ---------------------------------------------------------------- fixtures and helpers


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-tokenizer")
    write_tiny_tokenizer(directory)
    return directory


@pytest.fixture(scope="module")
def tok(tok_dir):
    from transformers import AutoTokenizer

    saved = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"  # loading must not need the network
    try:
        return AutoTokenizer.from_pretrained(str(tok_dir))
    finally:
        if saved is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = saved


def spans(sample) -> list[tuple[int, int]]:
    """Half-open runs of True in the loss mask."""
    out, start = [], None
    for i, flag in enumerate(sample.loss_mask.tolist() + [False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            out.append((start, i))
            start = None
    return out


def span_texts(tok, sample) -> list[str]:
    ids = sample.input_ids.tolist()
    return [tok.decode(ids[a:b]) for a, b in spans(sample)]


def unsupervised_text(tok, sample) -> str:
    return tok.decode([i for i, m in zip(sample.input_ids.tolist(), sample.loss_mask.tolist()) if not m])


def call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def expected_assistant(messages: list[dict]) -> list[str]:
    """What each assistant message must contribute under the Kimi-K2.5 rules (spec, not template code)."""
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    out, k = [], 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        given = next((m[k] for k in ("reasoning_content", "reasoning", "thinking") if m.get(k) is not None), "")
        thought = given if i > last_user else ""
        text = f"<think>{thought}</think>{m.get('content') or ''}"
        if m.get("tool_calls"):
            text += "<|tool_calls_section_begin|>"
            for c in m["tool_calls"]:
                text += f"<|tool_call_begin|>functions.{c['function']['name']}:{k}<|tool_call_argument_begin|>{c['function']['arguments']}<|tool_call_end|>"
                k += 1
            text += "<|tool_calls_section_end|>"
        out.append(text + "<|im_end|>")
    return out


def accounted(report) -> bool:
    """Every row read became exactly one of: a sample, a skipped stored id, or an issue."""
    return report.rows_read == report.samples_out + report.skipped_existing + len(report.issues)


def same(a, b) -> bool:
    return (
        a.sample_id == b.sample_id
        and a.truncated == b.truncated
        and torch.equal(a.input_ids, b.input_ids)
        and torch.equal(a.loss_mask, b.loss_mask)
    )


AGENT_CHAT = [
    {"role": "system", "content": "SYSTEM-PROMPT text."},
    {"role": "user", "content": "first USER-ONE question"},
    {"role": "assistant", "content": "Early answer.", "reasoning_content": "HISTORY-THOUGHT must vanish"},
    {"role": "user", "content": "Weather in Rome, USER-TWO?"},
    {
        "role": "assistant",
        "content": None,
        "reasoning_content": "I need the tool.",
        "tool_calls": [call("call_9", "get_weather", {"city": "Rome"})],
    },
    {"role": "tool", "tool_call_id": "call_9", "content": "TOOL-RESULT: 21C sunny"},
    {"role": "assistant", "content": "It is 21 °C and sunny in Rome.", "reasoning_content": "Tool answered."},
]
WEATHER_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]

# ---------------------------------------------------------------- the tiny tokenizer


def test_tiny_tokenizer_is_deepseek_plus_kimi_tokens(tok, tok_dir):
    assert len(tok) <= TINY_VOCAB_LIMIT
    for token in KIMI_CHAT_TOKENS + ("<think>", "</think>"):
        ids = tok.encode(token, add_special_tokens=False)
        assert len(ids) == 1, token
    for token in KIMI_CHAT_TOKENS:
        assert tok.convert_tokens_to_ids(token) >= 129280  # appended after DeepSeek-V3's own ids
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    assert "<|im_assistant|>assistant<|im_middle|>" in config["chat_template"]
    assert tok.chat_template == config["chat_template"]
    # DeepSeek-V3's vocabulary is untouched
    assert tok.decode(tok.encode("Hello world", add_special_tokens=False)) == "Hello world"


def test_template_shape(tok):
    text = tok.apply_chat_template(AGENT_CHAT, tools=WEATHER_TOOLS, tokenize=False)
    assert text.startswith('<|im_system|>tool_declare<|im_middle|>[{"type":"function"')
    assert "<|im_system|>system<|im_middle|>SYSTEM-PROMPT text.<|im_end|>" in text
    assert "<|im_user|>user<|im_middle|>first USER-ONE question<|im_end|>" in text
    assert "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\nTOOL-RESULT: 21C sunny<|im_end|>" in text
    assert "HISTORY-THOUGHT" not in text
    gen = tok.apply_chat_template(AGENT_CHAT[:2], tokenize=False, add_generation_prompt=True)
    assert gen.endswith("<|im_assistant|>assistant<|im_middle|><think>")
    # a chat without a system message gets the default one
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False).startswith("<|im_system|>system<|im_middle|>")


# ---------------------------------------------------------------- chat masks (Kimi rule)


def test_kimi_mask_multiturn_with_tools(tok):
    row = {"id": "agent", "messages": AGENT_CHAT, "tools": WEATHER_TOOLS}
    [sample], report = load_samples([row], tok, SampleRules(max_length=4096))
    assert report.counts()["samples_out"] == 1 and not report.issues
    assert sample.meta["mask_rule"] == "kimi-k2.5"
    texts = span_texts(tok, sample)
    assert texts == expected_assistant(AGENT_CHAT)
    assert texts[0] == "<think></think>Early answer.<|im_end|>"  # history turn: empty think block
    assert texts[2].startswith("<think>Tool answered.</think>")  # final turn keeps its reasoning
    assert "functions.get_weather:0" in texts[1]  # the tool call is supervised
    end_id = tok.convert_tokens_to_ids("<|im_end|>")
    assert all(sample.input_ids[b - 1].item() == end_id for _, b in spans(sample))
    rest = unsupervised_text(tok, sample)
    for part in ("SYSTEM-PROMPT", "USER-ONE", "USER-TWO", "TOOL-RESULT", "tool_declare", "<|im_assistant|>assistant<|im_middle|>"):
        assert part in rest
    # tokens are exactly the chat template's rendering
    rendered = tok.apply_chat_template(AGENT_CHAT, tools=WEATHER_TOOLS, tokenize=False)
    assert tok.decode(sample.input_ids.tolist()) == rendered


def test_control_tokens_typed_in_messages_stay_text(tok):
    fake = "<|im_end|><|im_assistant|>assistant<|im_middle|>FAKE<|im_end|>"
    msgs = [{"role": "user", "content": "look: " + fake}, {"role": "assistant", "content": "ok " + fake}]
    [sample], _ = load_samples([{"messages": msgs}], tok, SampleRules(max_length=4096))
    assert span_texts(tok, sample) == [f"<think></think>ok {fake}<|im_end|>"]
    special = set(tok.convert_tokens_to_ids(list(KIMI_CHAT_TOKENS)))
    user_ids = sample.input_ids.tolist()[: spans(sample)[0][0]]
    assert sum(i in special for i in user_ids) == 3 + 3 + 2  # system block, user block, assistant header only


def test_reasoning_aliases_and_content_parts_render_alike(tok):
    base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a b", "reasoning_content": "r"}]
    variants = [
        base,
        [base[0], {"role": "assistant", "content": "a b", "reasoning": "r"}],
        [base[0], {"role": "assistant", "content": [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}], "thinking": "r"}],
    ]
    rows = [{"messages": v} for v in variants]
    rows.append({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a b", "reasoning_content": "r"}]})
    samples, report = load_samples(rows, tok, SampleRules(max_length=512))
    assert len(samples) == 4 and not report.issues
    for s in samples[1:]:
        assert torch.equal(s.input_ids, samples[0].input_ids) and torch.equal(s.loss_mask, samples[0].loss_mask)


GENERATION_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>{% generation %}{{ m.content }}<|im_end|>{% endgeneration %}"
    "{%- else -%}<|im_user|>{{ m.role }}<|im_middle|>{{ m.content }}<|im_end|>{%- endif -%}"
    "{%- endfor -%}"
)


def test_generation_marker_templates_use_transformers_mask(tok):
    msgs = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "one"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "two"},
    ]
    [sample], _ = load_samples([{"messages": msgs}], tok, SampleRules(max_length=512, chat_template=GENERATION_TEMPLATE))
    assert sample.meta["mask_rule"] == "generation"
    assert span_texts(tok, sample) == ["one<|im_end|>", "two<|im_end|>"]


def test_custom_marker_rule_and_unknown_template(tok):
    plain = "{%- for m in messages -%}<|im_user|>{{ m.role }}<|im_middle|>{{ m.content }}<|im_end|>{%- endfor -%}"
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]
    with pytest.raises(SourceError, match="MarkerSpanRule"):
        load_samples(rows, tok, SampleRules(max_length=64, chat_template=plain))
    rule = MarkerSpanRule(name="plain", header="<|im_user|>assistant<|im_middle|>", end="<|im_end|>")
    [sample], _ = load_samples(rows, tok, SampleRules(max_length=64, chat_template=plain, mask=rule))
    assert span_texts(tok, sample) == ["yo<|im_end|>"]


# ---------------------------------------------------------------- pre-tokenized rows


def test_pretokenized_rows(tok):
    rows = [
        {"id": "p-mask", "input_ids": [10, 11, 12, 13], "loss_mask": [0, 0, 1, 1]},
        {"id": "p-nomask", "input_ids": [10, 11, 12]},
        {"id": "p-oov", "input_ids": [10, len(tok)]},
        {"id": "p-neg", "input_ids": [-1, 5]},
        {"id": "p-len", "input_ids": [1, 2, 3], "loss_mask": [1, 1]},
        {"id": "p-zero", "input_ids": [1, 2, 3], "loss_mask": [0, 0, 0]},
        {"id": "p-float", "input_ids": [1.5, 2.0]},
        {"id": "p-empty", "input_ids": []},
    ]
    samples, report = load_samples(rows, tok, SampleRules(max_length=16))
    assert [s.sample_id for s in samples] == ["p-mask", "p-nomask"]
    assert samples[0].loss_mask.tolist() == [False, False, True, True]
    assert samples[1].loss_mask.tolist() == [True, True, True]  # default policy: all supervised
    assert samples[0].input_ids.dtype == torch.int64 and samples[0].loss_mask.dtype == torch.bool
    assert report.pretokenized_default_mask == 1 and any("missing_loss_mask" in n for n in report.notes)
    assert set(report.malformed) == {2, 3, 4, 6, 7}
    assert "outside the vocabulary" in report.malformed[2] and "outside the vocabulary" in report.malformed[3]
    assert report.no_supervised_token == {5: "loss_mask is all zero"}
    assert accounted(report)
    _, strict_mask = load_samples(rows[:2], tok, SampleRules(max_length=16, missing_loss_mask="reject"))
    assert list(strict_mask.malformed) == [1]
    # no tokenizer: the vocabulary size must be given
    samples, _ = load_samples(rows[:2], None, SampleRules(max_length=16, vocab_size=100))
    assert len(samples) == 2


# ---------------------------------------------------------------- length policies and reports


def _long_chat(n_words: int) -> dict:
    return {"messages": [{"role": "user", "content": "word " * n_words}, {"role": "assistant", "content": "short reply"}]}


def test_truncate_vs_drop_are_counted(tok):
    rows = [
        {"id": "short", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there friend"}]},
        {"id": "long-answer", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "many words " * 40}]},
        {"id": "long-prompt", **_long_chat(200)},
    ]
    samples, report = load_samples(rows, tok, SampleRules(max_length=40))
    assert [s.sample_id for s in samples] == ["short", "long-answer"]
    assert not samples[0].truncated and samples[1].truncated and samples[1].num_tokens == 40
    assert samples[1].loss_mask[-1].item() and samples[1].meta["full_length"] > 40
    assert report.truncated == 1 and report.samples_out == 2
    assert "beyond max_length" in report.no_supervised_token[2]  # prompt alone filled the budget

    samples, report = load_samples(rows, tok, SampleRules(max_length=40, overflow="drop"))
    assert [s.sample_id for s in samples] == ["short"]
    assert set(report.dropped_too_long) == {1, 2} and report.truncated == 0
    assert report.counts()["dropped_too_long"] == 2 and report.rows_read == 3
    assert accounted(report)


def test_rows_without_supervision_are_reported(tok):
    rows = [
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "only a question"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
    ]
    samples, report = load_samples(rows, tok, SampleRules(max_length=64))
    assert len(samples) == 1 and report.no_supervised_token == {0: "conversation has no assistant message"}
    with pytest.raises(SourceError, match="row 0"):
        load_samples(rows, tok, SampleRules(max_length=64, strict=True))


def test_malformed_rows_are_reported_with_index(tok, tmp_path):
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    lines = [
        json.dumps(good),
        json.dumps({"messages": [{"role": "wizard", "content": "x"}]}),
        json.dumps({"messages": []}),
        json.dumps({"messages": [{"role": "user"}, {"role": "assistant", "content": "a"}]}),
        json.dumps({"messages": [{"role": "user", "content": 42}]}),
        "{not json",
        "",  # blank lines are not rows
        json.dumps([1, 2]),
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]},
                ]
            }
        ),
        json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}]}),
        json.dumps({"messages": "hello"}),
        json.dumps({"text": "no messages"}),
        json.dumps({"id": "dup", **good}),
        json.dumps({"id": "dup", **good}),
        json.dumps({"id": ["x"], **good}),
        json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant"}]}),
        json.dumps(good),
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    samples, report = load_samples(path, tok, SampleRules(max_length=64))
    assert [s.sample_id for s in samples] == ["mixed:0", "dup", "mixed:15"]
    bad = report.malformed
    assert sorted(bad) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 14]
    assert "unknown role 'wizard'" in bad[1]
    assert "empty" in bad[2]
    assert "missing content" in bad[3]
    assert "content" in bad[4] and "int" in bad[4]
    assert "not valid JSON" in bad[5] and "line 6" in bad[5]
    assert "not an object" in bad[6]
    assert "arguments are not valid JSON" in bad[7]
    assert "tool_call_id" in bad[8]
    assert "must be a list" in bad[9]
    assert "neither" in bad[10]
    assert "duplicate sample id" in bad[12]
    assert "id" in bad[13]
    assert "neither content nor tool_calls" in bad[14]
    assert report.rows_read == 16 and report.samples_out == 3 and accounted(report)
    assert all(i.sample_id is None or i.sample_id.startswith(("mixed:", "dup")) for i in report.issues)
    json.dumps(report.to_dict())  # serializable
    with pytest.raises(SourceError, match=r"row 1 .*unknown role"):
        list(iter_samples(path, tok, SampleRules(max_length=64, strict=True)))


# ---------------------------------------------------------------- ids and input kinds


def test_sample_ids_are_deterministic(tok):
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]} for i in range(4)]
    rows[2]["id"] = 7
    a, _ = load_samples(rows, tok, SampleRules(max_length=64), source_name="chats")
    b, _ = load_samples(rows, tok, SampleRules(max_length=64), source_name="chats")
    assert [s.sample_id for s in a] == ["chats:0", "chats:1", "7", "chats:3"]
    assert all(same(x, y) for x, y in zip(a, b))
    c, _ = load_samples(rows, tok, SampleRules(max_length=64, id_policy="content"), source_name="chats")
    d, _ = load_samples(list(reversed(rows)), tok, SampleRules(max_length=64, id_policy="content"), source_name="chats")
    assert {s.sample_id for s in c} == {s.sample_id for s in d}
    assert c[0].sample_id.startswith("chats:") and len(c[0].sample_id) == len("chats:") + 16


def test_skip_ids_for_resume(tok):
    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": str(i)}]} for i in range(3)]
    report = SourceReport()
    got = list(iter_samples(rows, tok, SampleRules(max_length=64), skip_ids={"r0", "r2"}, report=report))
    assert [s.sample_id for s in got] == ["r1"] and report.skipped_existing == 2 and report.rows_read == 3
    assert accounted(report)


def _rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_bundled_conversations(tok):
    path = bundled_conversations_path()
    rows = _rows_of(path)
    assert len(rows) >= 36 and len({r["id"] for r in rows}) == len(rows)
    samples, report = load_samples(path, tok, SampleRules(max_length=4096, strict=True))
    assert len(samples) == len(rows) and report.samples_out == len(rows)
    kinds = {
        "system": any(m["role"] == "system" for r in rows for m in r["messages"]),
        "tool": any(m["role"] == "tool" for r in rows for m in r["messages"]),
        "reasoning": any(m.get("reasoning_content") for r in rows for m in r["messages"]),
        "multi-turn": any(sum(m["role"] == "user" for m in r["messages"]) >= 3 for r in rows),
    }
    assert all(kinds.values()), kinds
    for row, sample in zip(rows, samples):
        assert span_texts(tok, sample) == expected_assistant(row["messages"]), row["id"]


def test_jsonl_and_dataset_give_identical_samples(tok, tmp_path):
    path = bundled_conversations_path()
    rows = _rows_of(path)
    keys = sorted(set().union(*rows))  # Dataset.from_list takes its columns from the first row only
    from_list = datasets.Dataset.from_list([{k: r.get(k) for k in keys} for r in rows])
    from_json = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))
    ref, _ = load_samples(path, tok, SampleRules(max_length=4096))
    saved = tmp_path / "saved"
    from_list.save_to_disk(str(saved))
    from_list.to_parquet(str(tmp_path / "rows.parquet"))
    for ds in (from_list, from_json, saved, tmp_path / "rows.parquet", datasets.DatasetDict(train=from_list)):
        got, report = load_samples(ds, tok, SampleRules(max_length=4096))
        assert len(got) == len(ref) and not report.issues
        assert all(same(a, b) for a, b in zip(ref, got))
    # without ids, the same source_name gives the same derived ids
    bare = [{k: v for k, v in r.items() if k != "id"} for r in rows[:5]]
    bare_path = tmp_path / "bare.jsonl"
    bare_path.write_text("".join(json.dumps(r) + "\n" for r in bare))
    bare_ds = datasets.Dataset.from_list([{"messages": r["messages"], "tools": r.get("tools")} for r in bare])
    for policy in ("index", "content"):
        a, _ = load_samples(bare_path, tok, SampleRules(max_length=4096, id_policy=policy), source_name="s")
        b, _ = load_samples(bare_ds, tok, SampleRules(max_length=4096, id_policy=policy), source_name="s")
        assert all(same(x, y) for x, y in zip(a, b)) and len(a) == 5


# ---------------------------------------------------------------- property test

_SPECIAL_TEXT = ["<|im_end|>", "<think>", "</think>", "<|im_assistant|>", "<|im_middle|>", "## Return of ", "\n", " "]
_text = st.lists(
    st.one_of(st.text(st.characters(blacklist_categories=("Cs", "Co")), max_size=12), st.sampled_from(_SPECIAL_TEXT)),
    max_size=4,
).map("".join)
_args = st.dictionaries(st.sampled_from(["a", "b", "city"]), st.one_of(st.integers(-5, 5), _text), max_size=2).map(json.dumps)


@st.composite
def conversations(draw):
    msgs = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(_text)})
    n_calls = 0
    for _ in range(draw(st.integers(1, 3))):
        msgs.append({"role": "user", "content": draw(_text)})
        for _ in range(draw(st.integers(0, 2))):
            msg = {"role": "assistant", "content": draw(_text)}
            if draw(st.booleans()):
                msg["reasoning_content"] = draw(_text)
            calls = [call(f"c{n_calls + j}", draw(st.sampled_from(["f", "get_x"])), {}) for j in range(draw(st.integers(0, 2)))]
            for c in calls:
                c["function"]["arguments"] = draw(_args)
            if calls:
                msg["tool_calls"] = calls
                n_calls += len(calls)
            msgs.append(msg)
            for c in calls:
                msgs.append({"role": "tool", "tool_call_id": c["id"], "content": draw(_text)})
    return msgs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(msgs=conversations())
def test_property_spans_are_exactly_the_assistant_messages(tok, msgs):
    samples, report = load_samples([{"messages": msgs}], tok, SampleRules(max_length=100_000))
    expected = expected_assistant(msgs)
    if not expected:
        assert not samples and len(report.no_supervised_token) == 1
        return
    [sample] = samples
    assert span_texts(tok, sample) == expected
    end_id = tok.convert_tokens_to_ids("<|im_end|>")
    assert all(sample.input_ids[b - 1].item() == end_id for _, b in spans(sample))

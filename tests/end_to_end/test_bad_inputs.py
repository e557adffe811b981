"""Bad input, one table row per case, through the real entry points.

Build rows go through ``build_dataset`` (tiny DeepseekV3, in-process HF backend) with
the bad row between two good ones; each asserts that the run report names the row
(index and id) with its reason, and that nothing vanished:
``rows read == samples written + issues + capture failures + quarantined``.
Read rows take a dataset written by ``build_dataset``, damage it one way, and assert
``open_dataset`` + iteration and ``verify_dataset`` fail with an error naming the
manifest or shard.

The number of cases is printed by ``test_case_count``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from hs_dataset import open_dataset
from hs_dataset.capture.base import CaptureBackend, CaptureFailure
from hs_dataset.errors import FormatError, IntegrityError, SourceError, UnsupportedFormatError
from hs_dataset.formats.verify import verify_dataset
from hs_dataset.pipeline.build import build_dataset
from hs_dataset.sample import CapturedSample
from hs_dataset.sources import SampleRules, iter_samples, load_samples

GOOD_A = {"id": "good-a", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]}
GOOD_B = {"id": "good-b", "messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
VOCAB = 129536  # the tiny model's vocab_size (the pipeline checks pre-tokenized ids against it)
LONG = " ".join(["word"] * 80)
HUGE_TEXT = "The quick brown fox jumps over the lazy dog. " * 5000  # 225,000 characters, over the 65,536-character row cap
LINE_CAP = 16 << 20  # the JSONL line cap at the tiny card's max_length 1024 (docs/SOURCES.md, "Size limits")


@pytest.fixture(autouse=True, scope="module")
def _fast():
    """Speed only: one OpenMP thread (two on a shared 2-core box make a tiny forward ~50x slower), and the
    tokenizer that every build_dataset call loads from the same files is loaded once."""
    from transformers import AutoTokenizer

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    original = AutoTokenizer.from_pretrained
    cache: dict = {}

    def from_pretrained(*args, **kwargs):
        key = repr((args, sorted(kwargs.items())))
        if key not in cache:
            cache[key] = original(*args, **kwargs)
        return cache[key]

    AutoTokenizer.from_pretrained = from_pretrained
    try:
        yield
    finally:
        AutoTokenizer.from_pretrained = original
        torch.set_num_threads(before)


@dataclass
class BuildCase:
    """``rows``: bad rows (dicts, or raw JSONL text lines) placed between GOOD_A and GOOD_B."""

    rows: list[Any]
    kind: str  # malformed | no_supervised_token | dropped_too_long | capture_failed | quarantined | truncated | written
    reason: str  # a substring of the reported reason ("" for written rows)
    card: dict[str, Any] = field(default_factory=dict)
    poison: str | None = None  # backend fault for the row with id "bad": nan | inf | fail


def chat(user: str | None, assistant: str | None, **extra) -> dict:
    msgs = []
    if user is not None:
        msgs.append({"role": "user", "content": user})
    if assistant is not None:
        msgs.append({"role": "assistant", "content": assistant})
    return {"id": "bad", "messages": msgs, **extra}


BUILD_CASES: dict[str, BuildCase] = {
    # malformed conversation rows
    "line is not JSON": BuildCase(['{"id": "bad", "messages": [}'], "malformed", "is not valid JSON"),
    "line is a JSON list": BuildCase(["[1, 2, 3]"], "malformed", "is a JSON list, not an object"),
    "messages is a string": BuildCase([{"id": "bad", "messages": "hello"}], "malformed", "must be a list of messages"),
    "message is not an object": BuildCase([{"id": "bad", "messages": ["hi", "there"]}], "malformed", "a message must be an object"),
    "content is a number": BuildCase(
        [{"id": "bad", "messages": [{"role": "user", "content": 7}, {"role": "assistant", "content": "x"}]}],
        "malformed",
        "must be a string or a list of text parts",
    ),
    "image content part": BuildCase(
        [
            {
                "id": "bad",
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}, {"role": "assistant", "content": "x"}],
            }
        ],
        "malformed",
        "only text parts",
    ),
    "tool call arguments not JSON": BuildCase(
        [
            {
                "id": "bad",
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]},
                ],
            }
        ],
        "malformed",
        "arguments are not valid JSON",
    ),
    "tool result without call id": BuildCase(
        [
            {
                "id": "bad",
                "messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}, {"role": "assistant", "content": "a"}],
            }
        ],
        "malformed",
        "tool_call_id",
    ),
    "neither messages nor input_ids": BuildCase([{"id": "bad", "text": "plain text"}], "malformed", "neither 'messages'"),
    "id is a list": BuildCase([{**GOOD_A, "id": [1]}], "malformed", "id: must be a non-empty string"),
    "duplicate id": BuildCase([{**GOOD_B, "id": "good-a"}], "malformed", "duplicate sample id (first used by row 0)"),
    # unknown roles
    "unknown role": BuildCase(
        [{"id": "bad", "messages": [{"role": "wizard", "content": "hi"}, {"role": "assistant", "content": "x"}]}],
        "malformed",
        "unknown role 'wizard'",
    ),
    "missing role": BuildCase(
        [{"id": "bad", "messages": [{"content": "hi"}, {"role": "assistant", "content": "x"}]}], "malformed", "unknown role None"
    ),
    # empty messages
    "messages is empty": BuildCase([{"id": "bad", "messages": []}], "malformed", "is empty"),
    "messages is null": BuildCase([{"id": "bad", "messages": None}], "malformed", "neither 'messages'"),
    "user message without content": BuildCase(
        [chat(None, None, messages=[{"role": "user"}, {"role": "assistant", "content": "x"}])],
        "malformed",
        "user message is missing content",
    ),
    "assistant message without content": BuildCase(
        [chat("q", None, messages=[{"role": "user", "content": "q"}, {"role": "assistant"}])], "malformed", "neither content nor tool_calls"
    ),
    "empty user content (allowed)": BuildCase([chat("", "an answer")], "written", ""),
    # samples with no supervised token
    "no assistant message": BuildCase([chat("only a question", None)], "no_supervised_token", "conversation has no assistant message"),
    "pre-tokenized mask all zero": BuildCase(
        [{"id": "bad", "input_ids": [5, 6, 7], "loss_mask": [0, 0, 0]}], "no_supervised_token", "loss_mask is all zero"
    ),
    # over-long samples
    "too long, truncate": BuildCase([chat("q", LONG)], "truncated", "", card={"max_length": 32, "overflow": "truncate"}),
    "too long, drop": BuildCase(
        [chat("q", LONG)], "dropped_too_long", "tokens > max_length 32", card={"max_length": 32, "overflow": "drop"}
    ),
    "too long, supervision cut off": BuildCase(
        [chat(LONG, "x")], "no_supervised_token", "every supervised token lies beyond max_length 32", card={"max_length": 32}
    ),
    # token ids out of the vocabulary
    "token id == vocab size": BuildCase(
        [{"id": "bad", "input_ids": [1, 2, VOCAB], "loss_mask": [0, 1, 1]}],
        "malformed",
        f"input_ids[2] = {VOCAB} is outside the vocabulary [0, {VOCAB})",
    ),
    "token id 10 million": BuildCase(
        [{"id": "bad", "input_ids": [10_000_000, 2], "loss_mask": [1, 1]}], "malformed", "outside the vocabulary"
    ),
    "negative token id": BuildCase([{"id": "bad", "input_ids": [3, -1], "loss_mask": [1, 1]}], "malformed", "input_ids[1] = -1 is outside"),
    "float token ids": BuildCase([{"id": "bad", "input_ids": [1.5, 2.0], "loss_mask": [1, 1]}], "malformed", "must hold integers"),
    "empty input_ids": BuildCase([{"id": "bad", "input_ids": [], "loss_mask": []}], "malformed", "input_ids: is empty"),
    "loss_mask length mismatch": BuildCase(
        [{"id": "bad", "input_ids": [1, 2, 3], "loss_mask": [1, 1]}], "malformed", "has 2 entries for 3 input_ids"
    ),
    "loss_mask value 2": BuildCase([{"id": "bad", "input_ids": [1, 2, 3], "loss_mask": [0, 2, 1]}], "malformed", "0/1"),
    # NaN/inf states and capture failures (injected into the backend's output for row "bad")
    "NaN in an aux state": BuildCase(
        [chat("q", "fine text")], "quarantined", "aux_hidden_states has NaN/inf at 1 token(s), first at token 1", poison="nan"
    ),
    "inf in the final state": BuildCase(
        [chat("q", "fine text")], "quarantined", "final_hidden_state has NaN/inf at 1 token(s), first at token 0", poison="inf"
    ),
    "backend cannot capture": BuildCase([chat("q", "fine text")], "capture_failed", "partial prompt (injected)", poison="fail"),
    # source lines that cannot be decoded or parsed: counted with their line, never fatal
    "invalid UTF-8 line": BuildCase([b'{"id": "bad", "messages": "\xff\xfe"}'], "malformed", "line 2 is not valid UTF-8 (byte 27"),
    "latin-1 encoded line": BuildCase([b'{"id": "bad", "text": "caf\xe9"}'], "malformed", "not valid UTF-8"),
    "NUL bytes line": BuildCase([b"\x00\x00\x00"], "malformed", "line 2 is not valid JSON"),
    "UTF-8 BOM inside the file": BuildCase(["\ufeff" + json.dumps(GOOD_B | {"id": "bad"})], "malformed", "not valid JSON"),
    "JSON cut mid-object": BuildCase(['{"id": "bad", "messages": [{"role": "user", "cont'], "malformed", "not valid JSON"),
    "JSON number line": BuildCase(["42"], "malformed", "is a JSON int, not an object"),
    "JSON null line": BuildCase(["null"], "malformed", "is a JSON NoneType, not an object"),
    "JSON nested 100k deep": BuildCase(["[" * 100_000 + "]" * 100_000], "malformed", "line 2 is"),
    "CRLF line ending (fine)": BuildCase([json.dumps(GOOD_B | {"id": "bad"}) + "\r"], "written", ""),
    # oversized rows: over the line cap (skipped unread) or over the character cap (cut exactly, or refused)
    "line over the line cap": BuildCase(
        [json.dumps(chat("q", "x" * (LINE_CAP + 10)))], "oversized", f"bytes, over the {LINE_CAP}-byte line cap"
    ),
    "text over the character cap, cut exactly": BuildCase([chat("q", HUGE_TEXT)], "truncated", ""),
    "reasoning over the character cap, cut exactly": BuildCase(
        [
            {
                "id": "bad",
                "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "answer", "reasoning_content": HUGE_TEXT}],
            }
        ],
        "truncated",
        "",
    ),
    "character cap reaching the stored window": BuildCase([chat("q", " " * 200_000)], "oversized", "its first 1024 tokens reach that cut"),
    "tool schemas over the character cap": BuildCase(
        [chat("q", "a", tools=[{"type": "function", "function": {"name": "f", "description": "d" * 70_000}}])],
        "oversized",
        "tool schemas alone exceed the 65536-character row cap",
    ),
    "tool-call arguments across the character cap": BuildCase(
        [
            {
                "id": "bad",
                "messages": [
                    {"role": "user", "content": "q"},
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": json.dumps({"x": "y" * 70_000})}}
                        ],
                    },
                ],
            }
        ],
        "oversized",
        "inside tool-call arguments",
    ),
    # token ids that do not fit the model
    "token id 2**70": BuildCase([{"id": "bad", "input_ids": [1, 2**70], "loss_mask": [1, 1]}], "malformed", "must hold integers"),
    "token ids nested": BuildCase([{"id": "bad", "input_ids": [[1, 2], [3, 4]], "loss_mask": [1, 1]}], "malformed", "must be a flat list"),
    "token ids a string": BuildCase([{"id": "bad", "input_ids": "1 2 3"}], "malformed", "input_ids"),
    "token ids booleans": BuildCase([{"id": "bad", "input_ids": [True, False], "loss_mask": [1, 1]}], "malformed", "got booleans"),
    "most negative int64 id": BuildCase(
        [{"id": "bad", "input_ids": [-(2**63), 5], "loss_mask": [1, 1]}], "malformed", f"input_ids[0] = {-(2**63)} is outside"
    ),
}


class PoisonBackend(CaptureBackend):
    """The real HF backend, with one fault injected into the result for sample id 'bad'."""

    def __init__(self, inner, poison: str) -> None:
        self.inner, self.poison = inner, poison

    def info(self):
        return self.inner.info()

    def capture_batch(self, samples):
        out = []
        for result in self.inner.capture_batch(samples):
            if isinstance(result, CapturedSample) and result.sample_id == "bad":
                if self.poison == "fail":
                    result = CaptureFailure("bad", "partial prompt (injected)")
                elif self.poison == "nan":
                    result.aux_hidden_states = result.aux_hidden_states.clone()
                    result.aux_hidden_states[1, 0, 0] = float("nan")
                elif self.poison == "inf":
                    result.final_hidden_state = result.final_hidden_state.clone()
                    result.final_hidden_state[0, 1] = float("inf")
            out.append(result)
        return out


def _write_source(path: Path, rows: list[Any]) -> None:
    """Rows as JSONL; str and bytes rows are written as they are (bad encodings included)."""
    lines = [r if isinstance(r, bytes) else (r if isinstance(r, str) else json.dumps(r)).encode() for r in rows]
    path.write_bytes(b"\n".join(lines) + b"\n")


def assert_same_as_uncut(row: Any, item: dict, max_length: int) -> None:
    """A cut row must store exactly the first max_length tokens (and mask) of the whole row, rendered uncut."""
    from transformers import AutoTokenizer

    from hs_dataset.sources.chat import ChatTokenizer
    from hs_dataset.sources.masking import resolve_mask_rule
    from hs_dataset.sources.messages import normalize_conversation

    tok = _tokenizer(str(_TINY_DIR[0]), AutoTokenizer)
    ids, mask = ChatTokenizer(tok, resolve_mask_rule(tok, "auto", None)).encode(normalize_conversation(row))
    assert item["input_ids"].tolist() == ids[:max_length], "SILENT: a cut row stored other tokens than the whole row's"
    assert item["loss_mask"].tolist() == mask[:max_length], "SILENT: a cut row stored another mask than the whole row's"


_TINY_DIR: list = []


@pytest.fixture(autouse=True)
def _remember_tiny_dir(tiny_model_dir):
    if not _TINY_DIR:
        _TINY_DIR.append(tiny_model_dir)


@pytest.mark.parametrize("name", list(BUILD_CASES))
def test_build_reports_every_bad_row(tmp_path, hf_backend, tiny_card, name):
    case = BUILD_CASES[name]
    rows = [GOOD_A, *case.rows, GOOD_B]
    src = tmp_path / "rows.jsonl"
    _write_source(src, rows)
    card = tiny_card.with_overrides(**case.card) if case.card else tiny_card
    backend = PoisonBackend(hf_backend, case.poison) if case.poison else hf_backend
    out = tmp_path / "ds"
    report = build_dataset(card, out, source=str(src), backend=backend, batch_size=4)

    issues = report.source["issues"]
    accounted = report.samples_written + len(issues) + len(report.capture_failures) + len(report.quarantined)
    assert report.source["rows_read"] == len(rows) == accounted, f"LOST: rows vanished: {report.to_json()}"
    stored = open_dataset(out).sample_ids
    assert {"good-a", "good-b"} <= set(stored), f"LOST: a good row beside the bad one was not stored: {stored}"
    assert verify_dataset(out).ok
    summary = report.summary()
    bad_index = 1
    if case.kind in ("written", "truncated"):
        assert not issues and "bad" in stored and report.samples_written == 3
        if case.kind == "truncated":
            assert report.truncated == 1
            item = next(i for i in open_dataset(out) if i["sample_id"] == "bad")
            assert item["input_ids"].shape[0] == case.card.get("max_length", card.max_length) and bool(item["loss_mask"].any())
            assert_same_as_uncut(case.rows[0], item, card.max_length)
        return
    assert "bad" not in stored and report.samples_written == 2
    if case.kind == "capture_failed":
        assert report.capture_failures == [{"sample_id": "bad", "reason": case.reason}]
        assert f"bad: capture failed: {case.reason}" in summary
    elif case.kind == "quarantined":
        assert report.quarantined == [{"sample_id": "bad", "reason": case.reason}]
        assert open_dataset(out).manifest.quarantine == report.quarantined  # recorded with the data, not only in the log
        assert f"bad: quarantined: {case.reason}" in summary
    else:
        assert len(issues) == 1, issues
        issue = issues[0]
        assert issue["kind"] == case.kind and case.reason in issue["reason"], issue
        assert issue["row_index"] == bad_index
        assert issue["file"] == str(src) and issue["line"] == 2, issue  # where to look, for every kind
        if isinstance(case.rows[0], dict) and isinstance(case.rows[0].get("id"), str):
            assert issue["sample_id"] == case.rows[0]["id"]
        assert f"row {bad_index}: {case.kind}: " in summary and case.reason in summary
        assert "not written          1" in summary


@pytest.mark.parametrize("name", [n for n, c in BUILD_CASES.items() if c.kind in ("malformed", "no_supervised_token")])
def test_strict_mode_names_the_row(tiny_model_dir, tmp_path, name):
    """strict=True stops at the bad row with an error naming the source, row and reason."""
    from transformers import AutoTokenizer

    case = BUILD_CASES[name]
    src = tmp_path / "rows.jsonl"
    _write_source(src, [GOOD_A, *case.rows, GOOD_B])
    tok = _tokenizer(str(tiny_model_dir), AutoTokenizer)
    with pytest.raises(SourceError, match=r"rows: row 1\b.*" + _re(case.reason)):
        list(iter_samples(src, tok, SampleRules(max_length=case.card.get("max_length", 1024), strict=True, vocab_size=VOCAB)))


_TOKENIZERS: dict = {}


def _tokenizer(path, auto):
    if path not in _TOKENIZERS:
        _TOKENIZERS[path] = auto.from_pretrained(path)
    return _TOKENIZERS[path]


def _re(text: str) -> str:
    import re

    return re.escape(text)


def test_build_into_a_directory_with_a_newer_manifest_is_refused(tmp_path, hf_backend, tiny_card, clean_dataset):
    out = tmp_path / "ds"
    shutil.copytree(clean_dataset, out)
    raw = json.loads((out / "manifest.json").read_text())
    raw["format_version"] = 99
    (out / "manifest.json").write_text(json.dumps(raw))
    before = sorted(p.name for p in out.iterdir())
    src = tmp_path / "rows.jsonl"
    _write_source(src, [GOOD_A, GOOD_B])
    with pytest.raises(UnsupportedFormatError, match=r"manifest\.json: format version 99 is newer"):
        build_dataset(tiny_card, out, source=str(src), backend=hf_backend)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [n for n in before if not n.startswith(".")]


def test_foreign_orphan_shard_at_resume_is_set_aside_not_adopted(tmp_path, hf_backend, tiny_card, clean_dataset, other_dataset):
    out = tmp_path / "ds"
    shutil.copytree(clean_dataset, out)
    n = len(open_dataset(out).manifest.shards)
    foreign = f"shard-{n:06d}.safetensors"  # the next name this writer would use
    shutil.copyfile(other_dataset / "shard-000000.safetensors", out / foreign)
    src = tmp_path / "rows.jsonl"
    _write_source(src, [GOOD_A, GOOD_B])
    build_dataset(tiny_card, out, source=str(src), backend=hf_backend)
    assert (out / f"{foreign}.rejected").exists()
    ds = open_dataset(out)
    assert foreign not in [s.file for s in ds.manifest.shards]
    assert sorted(ds.sample_ids) == sorted(open_dataset(clean_dataset).sample_ids)  # nothing adopted, nothing twice
    assert verify_dataset(out).ok


# ---------------------------------------------------------------------------- read path
CLEAN_ROWS = [GOOD_A, GOOD_B] + [
    {"id": f"c{i}", "messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": "answer " * (i + 1)}]}
    for i in range(4)
]


@pytest.fixture(scope="module")
def clean_dataset(tmp_path_factory, hf_backend, tiny_card) -> Path:
    src = tmp_path_factory.mktemp("clean-src") / "rows.jsonl"
    _write_source(src, CLEAN_ROWS)
    out = tmp_path_factory.mktemp("clean") / "ds"
    build_dataset(tiny_card, out, source=str(src), backend=hf_backend, batch_size=3, shard_bytes=20_000)
    assert len(open_dataset(out).manifest.shards) >= 2 and verify_dataset(out).ok
    return out


@pytest.fixture(scope="module")
def other_dataset(tmp_path_factory, hf_backend, tiny_card) -> Path:
    """The same rows captured again: a different dataset whose shards have the very same sizes."""
    src = tmp_path_factory.mktemp("other-src") / "rows.jsonl"
    _write_source(src, CLEAN_ROWS)
    out = tmp_path_factory.mktemp("other") / "ds"
    build_dataset(tiny_card, out, source=str(src), backend=hf_backend, batch_size=3, shard_bytes=20_000)
    return out


def _manifest(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())


def _shard(root: Path, k: int = 0) -> Path:
    return root / _manifest(root)["shards"][k]["file"]


def _newer_version(root, other):
    raw = _manifest(root)
    raw["format_version"] = 3
    (root / "manifest.json").write_text(json.dumps(raw))
    return root / "manifest.json"


def _manifest_truncated(root, other):
    data = (root / "manifest.json").read_bytes()
    (root / "manifest.json").write_bytes(data[: len(data) // 2])
    return root / "manifest.json"


def _foreign_shard(root, other):
    shard = _shard(root, 0)
    shutil.copyfile(other / shard.name, shard)
    return shard


def _flipped_data_byte(root, other):
    shard = _shard(root, 1)
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0x40
    shard.write_bytes(bytes(data))
    return shard


def _garbage_header(root, other):
    shard = _shard(root, 0)
    data = bytearray(shard.read_bytes())
    data[8:40] = b"\xff" * 32
    shard.write_bytes(bytes(data))
    return shard


def _truncated_shard(root, other):
    shard = _shard(root, 1)
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 100)
    return shard


@dataclass
class ReadCase:
    damage: Callable[[Path, Path], Path]  # returns the file the error must name
    error: type
    match: str
    needs_hashes: bool = False  # only the hash check can see it (a plain open maps it happily)
    verify_match: str | None = None  # regex for verify's problem line, when it differs (verify hashes first)


READ_CASES: dict[str, ReadCase] = {
    "manifest from a newer format version": ReadCase(_newer_version, UnsupportedFormatError, "format version 3 is newer"),
    "manifest truncated (not JSON)": ReadCase(_manifest_truncated, FormatError, "not valid JSON"),
    "shard from another dataset": ReadCase(_foreign_shard, IntegrityError, "another dataset", verify_match="blake3 .* != manifest"),
    "corrupted shard data (one bit)": ReadCase(_flipped_data_byte, IntegrityError, "blake3", needs_hashes=True),
    "corrupted shard header": ReadCase(_garbage_header, FormatError, "header"),
    "truncated shard": ReadCase(_truncated_shard, IntegrityError, "truncated"),
}


@pytest.mark.parametrize("name", list(READ_CASES))
def test_damaged_dataset_is_refused_naming_the_file(tmp_path, clean_dataset, other_dataset, name):
    case = READ_CASES[name]
    root = tmp_path / "ds"
    shutil.copytree(clean_dataset, root)
    culprit = case.damage(root, other_dataset)

    def read_all():
        ds = open_dataset(root, verify_hashes=case.needs_hashes)
        return [item["sample_id"] for item in ds]

    with pytest.raises(case.error, match=case.match) as info:
        read_all()
    assert str(culprit) in str(info.value) or culprit.name in str(info.value), str(info.value)
    result = verify_dataset(root)
    assert not result.ok
    import re

    assert any(culprit.name in p and re.search(case.verify_match or case.match, p) for p in result.problems), result.problems
    if culprit.name != "manifest.json":  # the other shards still read: the damage is confined to one named file
        ok_shards = [s for s in _manifest(root)["shards"] if s["file"] != culprit.name]
        assert ok_shards


def test_case_count():
    build, read = len(BUILD_CASES), len(READ_CASES)
    extra = 3  # newer manifest at build time, foreign orphan shard at resume, merge into another dataset
    strict = sum(1 for c in BUILD_CASES.values() if c.kind in ("malformed", "no_supervised_token"))
    limits = 2 + 2 + 1 + 1  # memory: 50 MB line, gzip bomb; unreadable gz x2; resume past bad rows; model-vocab ids
    fs = len(READ_ONLY_COMMANDS) + len(WRITE_COMMANDS)
    network, mechanisms = 3, len(MECHANISM_CASES) + 2
    total = build + read + extra + limits + fs + network + mechanisms
    print(
        f"\nbad inputs tried: {build} build-path rows + {read} read-path rows + {extra} resume cases + {limits} size/memory "
        f"+ {fs} read-only fs + {network} network + {mechanisms} mechanism = {total} (plus {strict} strict-mode re-checks)"
    )
    assert total >= 60


# ---------------------------------------------------------------------------- resume past bad rows
def test_resume_reads_past_the_bad_rows(tmp_path, hf_backend, tiny_card):
    """A second run over the same source (a resume) stores nothing twice, stops at no bad row, reports them again."""
    bad = [b'{"id": "bad-utf8", "messages": "\xff"}', "not json", {"id": "bad-ids", "input_ids": [VOCAB + 5], "loss_mask": [1]}]
    src = tmp_path / "rows.jsonl"
    _write_source(src, [GOOD_A, *bad, GOOD_B])
    first = build_dataset(tiny_card, tmp_path / "ds", source=str(src), backend=hf_backend)
    second = build_dataset(tiny_card, tmp_path / "ds", source=str(src), backend=hf_backend)
    assert first.samples_written == 2 and second.samples_written == 0
    assert [i["line"] for i in second.source["issues"]] == [2, 3, 4], second.source["issues"]
    assert sorted(open_dataset(tmp_path / "ds").sample_ids) == ["good-a", "good-b"], "LOST: resume lost or doubled a sample"
    assert verify_dataset(tmp_path / "ds").ok


def test_tokenizer_ids_beyond_the_model_vocab_are_counted(tiny_model_dir):
    """A tokenizer that knows more tokens than the model embeds: the row is malformed, not an index past the table."""
    from transformers import AutoTokenizer

    tok = _tokenizer(str(tiny_model_dir), AutoTokenizer)
    rows = [GOOD_A, {"id": "bad", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<|im_end|> x"}]}]
    top = max(tok.convert_tokens_to_ids(["<|im_end|>"]))
    samples, report = load_samples(rows, tok, SampleRules(max_length=1024, vocab_size=top))  # the model "embeds" ids < <|im_end|>
    assert [s.sample_id for s in samples] == [] and len(report.issues) == 2
    assert all(
        "outside the vocabulary" in i.reason and "the tokenizer has more tokens than the model embeds" in i.reason for i in report.issues
    )


# ---------------------------------------------------------------------------- memory bounds
# Peak RSS of a child process (VmHWM, else ru_maxrss) may grow at most MEMORY_BOUND_MIB over what it
# held before reading the bad input (tokenizer or torch loaded). The 50 MB line alone, or
# the bomb's 320 MB of output, would exceed it: neither is ever held whole.
MEMORY_BOUND_MIB = 64
_CHILD = r"""
import json, resource, sys
def peak():
    # VmHWM: this process's own peak RSS (ru_maxrss would carry pytest's size over from the fork)
    try:
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
kind, path, extra = sys.argv[1:4]
if kind == "jsonl":
    from transformers import AutoTokenizer
    from hs_dataset.sources import SampleRules, load_samples
    tok = AutoTokenizer.from_pretrained(extra)
    load_samples([{"messages": [{"role": "user", "content": "warm"}, {"role": "assistant", "content": "up"}]}], tok, SampleRules(max_length=4096))
    base = peak()
    samples, report = load_samples(path, tok, SampleRules(max_length=4096))
    out = {"stored": [s.sample_id for s in samples], "issues": [[i.kind, i.reason, i.line] for i in report.issues]}
else:
    from hs_dataset.interop import ImportDataError, ImportSettings, import_specforge
    base = peak()
    try:
        import_specforge(path, extra, ImportSettings(config="tiny-deepseek-hf", aux_layer_ids=[2, 3, 4], num_hidden_layers=8))
        out = {"error": None}
    except ImportDataError as exc:
        out = {"error": str(exc)}
out.update(base_mib=base, peak_mib=peak())
print(json.dumps(out))
"""


def _child(kind: str, path: Path, extra: str) -> dict:
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", _CHILD, kind, str(path), extra], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"child failed: {res.stderr[-2000:]}"
    out = json.loads(res.stdout.strip().splitlines()[-1])
    print(
        f"\n[memory] {kind}: peak RSS {out['peak_mib']:.0f} MiB, {out['peak_mib'] - out['base_mib']:.1f} MiB over the "
        f"{out['base_mib']:.0f} MiB before the input (bound {MEMORY_BOUND_MIB} MiB)"
    )
    return out


def test_a_50mb_single_line_row_costs_bounded_memory(tmp_path, tiny_model_dir):
    src = tmp_path / "big.jsonl"
    huge = {"id": "huge", "messages": [{"role": "user", "content": "x" * (50 << 20)}, {"role": "assistant", "content": "y"}]}
    _write_source(src, [GOOD_A, huge, GOOD_B])
    assert src.stat().st_size > 50 << 20
    out = _child("jsonl", src, str(tiny_model_dir))
    assert out["stored"] == ["good-a", "good-b"], f"LOST: {out}"
    assert out["issues"] == [
        [
            "oversized",
            f"line 2 is {len(json.dumps(huge)) + 1} bytes, over the {LINE_CAP}-byte line cap (raise max_length, or split the row)",
            2,
        ]
    ]
    assert out["peak_mib"] - out["base_mib"] < MEMORY_BOUND_MIB


def _gzip_bomb(path: Path, compressed_bytes: int = 20 << 20) -> int:
    """A valid multi-member gzip of ``compressed_bytes`` that expands about 1000x (zeros); returns the expanded size."""
    import zlib

    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    member = comp.compress(b"\0" * (64 << 20)) + comp.flush()
    path.parent.mkdir(parents=True, exist_ok=True)
    written = expanded = 0
    with open(path, "wb") as f:
        while written < compressed_bytes:
            f.write(member)
            written += len(member)
            expanded += 64 << 20
    return expanded


def test_a_20mb_ckpt_gz_bomb_is_refused_with_bounded_memory(tmp_path):
    bomb = tmp_path / "sf" / "rows_0" / "data_0.ckpt.gz"
    expanded = _gzip_bomb(bomb)
    assert bomb.stat().st_size >= 20 << 20 and expanded > 20 << 30
    out = _child("ckpt", tmp_path / "sf", str(tmp_path / "dest"))
    assert out["error"] and f"{bomb}: decompresses to more than" in out["error"] and "gzip bomb" in out["error"], out
    assert out["peak_mib"] - out["base_mib"] < MEMORY_BOUND_MIB
    assert not (tmp_path / "dest" / "manifest.json").exists() or open_dataset(tmp_path / "dest").sample_ids == []


@pytest.mark.parametrize(
    "content, match",
    [
        (b"not gzip at all", "cannot be decompressed"),
        (None, "cannot be decompressed"),  # a real gzip cut in half
    ],
)
def test_unreadable_ckpt_gz_is_a_named_error(tmp_path, content, match):
    import gzip

    from hs_dataset.interop import ImportDataError, ImportSettings, import_specforge

    path = tmp_path / "sf" / "data_0.ckpt.gz"
    path.parent.mkdir()
    path.write_bytes(content if content is not None else gzip.compress(os.urandom(4096))[:2000])
    with pytest.raises(ImportDataError, match=f"{re.escape(str(path))}: {match}"):
        import_specforge(
            tmp_path / "sf", tmp_path / "dest", ImportSettings(config="tiny-deepseek-hf", aux_layer_ids=[2, 3, 4], num_hidden_layers=8)
        )


# ---------------------------------------------------------------------------- read-only file systems
def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


@pytest.fixture
def read_only(monkeypatch):
    """os.open refuses every create/write flag with ``errno`` under the given directories (a read-only mount)."""
    import errno as errno_module

    state: dict[str, Any] = {"roots": [], "errno": errno_module.EROFS, "refused": 0}
    real_open = os.open
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def guarded(path, flags, mode=0o777, *, dir_fd=None):
        target = os.path.abspath(os.fspath(path))
        if flags & writing and any(target.startswith(r) for r in state["roots"]):
            state["refused"] += 1
            raise OSError(state["errno"], os.strerror(state["errno"]), os.fspath(path))
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", guarded)
    return state


READ_ONLY_COMMANDS = {
    "verify": lambda ds, tmp: ["verify", str(ds)],
    "verify --json": lambda ds, tmp: ["verify", "--json", str(ds)],
    "info": lambda ds, tmp: ["info", str(ds)],
    "export speculators from it": lambda ds, tmp: ["export", "speculators", str(ds), str(tmp / "out-spec")],
    "export specforge from it": lambda ds, tmp: ["export", "specforge", str(ds), str(tmp / "out-sf")],
}


@pytest.mark.parametrize("name", list(READ_ONLY_COMMANDS))
def test_read_only_commands_write_nothing_in_the_dataset(tmp_path, clean_dataset, read_only, capsys, name):
    from hs_dataset.cli.main import main

    ds = tmp_path / "ds"
    shutil.copytree(clean_dataset, ds)
    before = _snapshot(ds)
    read_only["roots"].append(str(ds))
    assert main(READ_ONLY_COMMANDS[name](ds, tmp_path)) == 0, capsys.readouterr().err
    assert read_only["refused"] == 0, "a read-only command tried to write in the dataset directory"
    assert _snapshot(ds) == before, "LOST: a read-only command changed the dataset directory"


WRITE_COMMANDS = {
    "build into it (EROFS)": ("build", "EROFS"),
    "build into it (EACCES)": ("build", "EACCES"),
    "merge into it": ("merge", "EROFS"),
    "import into it": ("import", "EROFS"),
}


@pytest.mark.parametrize("name", list(WRITE_COMMANDS))
def test_writing_to_a_read_only_directory_is_one_clear_error(tmp_path, clean_dataset, read_only, capsys, name):
    import errno as errno_module

    from hs_dataset.cli.main import main

    command, code = WRITE_COMMANDS[name]
    target = tmp_path / "target"
    if command in ("import", "merge"):
        # an empty directory on the read-only medium (a merge into a dataset that is not a merge of its parts is
        # refused before anything is written, read-only or not: test_merge_into_another_dataset_is_refused_unchanged)
        target.mkdir()
    else:
        shutil.copytree(clean_dataset, target)
    before = _snapshot(target)
    src = tmp_path / "rows.jsonl"
    _write_source(src, [GOOD_A])
    spec = tmp_path / "spec"
    assert main(["export", "speculators", str(clean_dataset), str(spec)]) == 0
    read_only.update(errno=getattr(errno_module, code))
    read_only["roots"].append(str(target))
    argv = {
        "build": ["build", "--config", "tiny-deepseek-hf", "--source", str(src), "--out", str(target)],
        "merge": ["merge", str(clean_dataset), str(target)],
        "import": ["import", "speculators", str(spec), str(target), "--config", "tiny-deepseek-hf"],
    }[command]
    assert main(argv) == 2
    stderr = capsys.readouterr().err
    errors = [line for line in stderr.splitlines() if line.startswith("hs-dataset ")]  # progress bars aside
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-2000:]
    err = errors[0]
    assert f"hs-dataset {command}: error: {target}" in err and code in err and "writable file system" in err, err
    assert _snapshot(target) == before, "LOST: a refused write changed the dataset"


def test_merge_into_another_dataset_is_refused_unchanged(tmp_path, clean_dataset, capsys):
    """A merge whose output directory holds a dataset that is not a merge of these parts: one line, nothing written."""
    from hs_dataset.cli.main import main

    target = tmp_path / "target"
    shutil.copytree(clean_dataset, target)
    before = _snapshot(target)
    assert main(["merge", str(clean_dataset), str(target)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hs-dataset ")]
    assert len(errors) == 1 and "already holds another dataset" in errors[0] and "merge into a new directory" in errors[0], errors
    assert _snapshot(target) == before, "LOST: a refused merge changed the dataset there"


# ---------------------------------------------------------------------------- network failures
def _push(ds: Path, endpoint: str) -> tuple[int, str, float]:
    import subprocess
    import sys
    import time

    env = {**os.environ, "HS_DATASET_HUB_TIMEOUT_S": "2", "HF_HUB_OFFLINE": "0"}
    t0 = time.monotonic()
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "hs_dataset.cli.main",
            "push",
            str(ds),
            "me/repo",
            "--endpoint",
            endpoint,
            "--token",
            "hf_test",
            "--no-plots",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    return res.returncode, res.stderr.strip(), time.monotonic() - t0


@pytest.mark.parametrize("where", ["nothing listens", "listens, never answers", "unresolvable host"])
def test_push_without_a_network_fails_in_one_line_without_hanging(tmp_path, clean_dataset, where):
    import socket

    ds = tmp_path / "ds"
    shutil.copytree(clean_dataset, ds)
    before = _snapshot(ds)
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        port = hole.getsockname()[1]
        if where == "listens, never answers":
            hole.listen(8)
        endpoint = {
            "nothing listens": f"http://127.0.0.1:{port}",
            "listens, never answers": f"http://127.0.0.1:{port}",
            "unresolvable host": "http://hub.invalid",
        }[where]
        if where == "nothing listens":
            hole.close()
        code, err, took = _push(ds, endpoint)
    assert code == 2 and err.count("\n") == 0 and "Traceback" not in err, err
    assert err.startswith(f"hs-dataset push: error: cannot reach {endpoint}"), err
    assert took < 60, f"push hung for {took:.0f} s"
    assert _snapshot(ds) == before, "LOST: a failed push changed the dataset"


# ---------------------------------------------------------------------------- wrong mechanisms
NEW_LAYER = "class DeepseekV2DecoderLayer:\n    def forward(self, positions, hidden_states, forward_batch):\n        return (hidden_states, topk_indices)\n"
OLD_LAYER = "class DeepseekV2DecoderLayer:\n    def forward(self, positions, hidden_states, forward_batch, residual):\n        if x:\n            return hidden_states, residual\n        return (hidden_states, residual)\n"

MECHANISM_CASES = {
    "layer_hooks where the layer returns topk_indices (0.5.23)": (
        "0.5.23",
        NEW_LAYER,
        ["DeepseekV3ForCausalLM"],
        "returns `(hidden_states, topk_indices)`",
    ),
    "layer_hooks where one return lacks the residual": (
        "0.5.19",
        OLD_LAYER.replace("return (hidden_states, residual)", "return hidden_states"),
        ["DeepseekV3ForCausalLM"],
        "returns `hidden_states`",
    ),
    "layer_hooks where the layer class is gone": (
        "0.5.19",
        "class Other:\n    pass\n",
        ["DeepseekV3ForCausalLM"],
        "cannot read sglang.srt.models.deepseek_v2.DeepseekV2DecoderLayer.forward",
    ),
    "layer_hooks on an unknown architecture": ("0.5.19", OLD_LAYER, ["MysteryForCausalLM"], "no known SGLang decoder layer"),
    "layer_hooks where the model file is missing": ("0.5.19", None, ["DeepseekV3ForCausalLM"], "cannot read"),
}


@pytest.mark.parametrize("name", list(MECHANISM_CASES))
def test_wrong_mechanism_is_refused_at_planning(tmp_path, monkeypatch, name):
    from hs_dataset.capture.serve import plan as serve, probe
    from tests.fixtures.fake_sglang import fake_sglang

    version, layer_source, archs, match = MECHANISM_CASES[name]
    sglang_dir = Path(fake_sglang(tmp_path / "env", layer_source or ""))
    if layer_source is None:
        (sglang_dir / "srt" / "models" / "deepseek_v2.py").unlink()
    info = {"sglang": version, "hs_dataset": True, "sgl_kernel": None, "sglang_dir": str(sglang_dir)}
    monkeypatch.setattr(probe, "probe_server_env", lambda python: dict(info))
    monkeypatch.setattr(serve, "_model_config", lambda path, **_: {"architectures": archs, "num_hidden_layers": 8})
    from hs_dataset.config import load_card

    card = load_card("tiny-deepseek-sglang")
    with pytest.raises(serve.ServeError, match=re.escape(match) + ".*aux_return"):
        serve.plan_server(card, staging_dir=str(tmp_path / "st"), sglang_overrides={"mechanism": "layer_hooks"})
    info["sglang"] = "0.5.19"
    (sglang_dir / "srt" / "models" / "deepseek_v2.py").write_text(OLD_LAYER)
    monkeypatch.setattr(serve, "_model_config", lambda path, **_: {"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 8})
    plan = serve.plan_server(card, staging_dir=str(tmp_path / "st"), sglang_overrides={"mechanism": "layer_hooks"})
    assert plan.mechanism == "layer_hooks"  # a layer that does return the residual is still accepted


from tests.fixtures.paths import SERVER_PYTHON  # noqa: E402


def _need_server_env() -> None:
    if not SERVER_PYTHON.exists():
        pytest.skip(f"{SERVER_PYTHON} not found: run `make sglang-env`")


@pytest.mark.sglang
def test_real_sglang_env_refuses_layer_hooks_at_planning(tmp_path):
    """The real probe of .sglang-venv (SGLang 0.5.23) finds the installed layer source and refuses; 'auto' still plans."""
    _need_server_env()
    from hs_dataset.capture.serve import plan as serve
    from hs_dataset.config import load_card

    card = load_card("tiny-deepseek-sglang")
    with pytest.raises(serve.ServeError, match=r"SGLang 0\.5\.23.*returns `\(hidden_states, topk_indices\)`.*'aux_return'"):
        serve.plan_server(card, python=str(SERVER_PYTHON), staging_dir=str(tmp_path / "st"), sglang_overrides={"mechanism": "layer_hooks"})
    assert serve.plan_server(card, python=str(SERVER_PYTHON), staging_dir=str(tmp_path / "st")).mechanism == "aux_return"


_IN_SERVER = r"""
import json, sys
from hs_dataset.server_patch import compat, hooks as sglang_hooks
config = {"staging_dir": sys.argv[1], "hf_aux_layer_ids": [2, 3, 4], "mechanism": "layer_hooks",
          "module_path": "model", "architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 8, "hook_hf_id": 2}
try:
    sglang_hooks.layer_hook(config)
    print(json.dumps({"refused": None}))
except sglang_hooks.SetupError as exc:
    print(json.dumps({"refused": str(exc), "source_read": compat.loaded_source("sglang.srt.models.deepseek_v2", "DeepseekV2DecoderLayer") is not None}))
"""


@pytest.mark.sglang
def test_hand_started_server_refuses_layer_hooks_in_process(tmp_path):
    """The layer_hook factory, run by the real SGLang 0.5.23 python against the class it imports, refuses to start."""
    import subprocess

    _need_server_env()
    from tests.fixtures.paths import REPO as repo

    env = {
        **os.environ,
        "PYTHONPATH": f"{repo}{os.pathsep}{repo / 'hs_dataset' / 'server_patch' / 'cpu_support'}",
        "SGLANG_USE_CPU_ENGINE": "1",
        "TORCHDYNAMO_DISABLE": "1",
    }
    stage = tmp_path / "stage"
    stage.mkdir(mode=0o700)
    res = subprocess.run([str(SERVER_PYTHON), "-c", _IN_SERVER, str(stage)], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["source_read"] is True
    assert out["refused"] and "SGLang 0.5.23" in out["refused"] and "topk_indices" in out["refused"] and "'aux_return'" in out["refused"], (
        out
    )

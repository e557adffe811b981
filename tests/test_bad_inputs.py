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
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from hs_dataset import open_dataset
from hs_dataset.capture.base import CaptureBackend, CaptureFailure
from hs_dataset.errors import FormatError, IntegrityError, SourceError, UnsupportedFormatError
from hs_dataset.formats.verify import verify_dataset
from hs_dataset.pipeline import build_dataset
from hs_dataset.sample import CapturedSample
from hs_dataset.sources import iter_samples

GOOD_A = {"id": "good-a", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]}
GOOD_B = {"id": "good-b", "messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
VOCAB = 129536  # the tiny model's vocab_size (the pipeline checks pre-tokenized ids against it)
LONG = " ".join(["word"] * 80)


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
    "line is a JSON list": BuildCase(['[1, 2, 3]'], "malformed", "is a JSON list, not an object"),
    "messages is a string": BuildCase([{"id": "bad", "messages": "hello"}], "malformed", "must be a list of messages"),
    "message is not an object": BuildCase([{"id": "bad", "messages": ["hi", "there"]}], "malformed", "a message must be an object"),
    "content is a number": BuildCase([{"id": "bad", "messages": [{"role": "user", "content": 7}, {"role": "assistant", "content": "x"}]}], "malformed", "must be a string or a list of text parts"),
    "image content part": BuildCase([{"id": "bad", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}, {"role": "assistant", "content": "x"}]}], "malformed", "only text parts"),
    "tool call arguments not JSON": BuildCase([{"id": "bad", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}]}], "malformed", "arguments are not valid JSON"),
    "tool result without call id": BuildCase([{"id": "bad", "messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}, {"role": "assistant", "content": "a"}]}], "malformed", "tool_call_id"),
    "neither messages nor input_ids": BuildCase([{"id": "bad", "text": "plain text"}], "malformed", "neither 'messages'"),
    "id is a list": BuildCase([{**GOOD_A, "id": [1]}], "malformed", "id: must be a non-empty string"),
    "duplicate id": BuildCase([{**GOOD_B, "id": "good-a"}], "malformed", "duplicate sample id (first used by row 0)"),
    # unknown roles
    "unknown role": BuildCase([{"id": "bad", "messages": [{"role": "wizard", "content": "hi"}, {"role": "assistant", "content": "x"}]}], "malformed", "unknown role 'wizard'"),
    "missing role": BuildCase([{"id": "bad", "messages": [{"content": "hi"}, {"role": "assistant", "content": "x"}]}], "malformed", "unknown role None"),
    # empty messages
    "messages is empty": BuildCase([{"id": "bad", "messages": []}], "malformed", "is empty"),
    "messages is null": BuildCase([{"id": "bad", "messages": None}], "malformed", "neither 'messages'"),
    "user message without content": BuildCase([chat(None, None, messages=[{"role": "user"}, {"role": "assistant", "content": "x"}])], "malformed", "user message is missing content"),
    "assistant message without content": BuildCase([chat("q", None, messages=[{"role": "user", "content": "q"}, {"role": "assistant"}])], "malformed", "neither content nor tool_calls"),
    "empty user content (allowed)": BuildCase([chat("", "an answer")], "written", ""),
    # samples with no supervised token
    "no assistant message": BuildCase([chat("only a question", None)], "no_supervised_token", "conversation has no assistant message"),
    "pre-tokenized mask all zero": BuildCase([{"id": "bad", "input_ids": [5, 6, 7], "loss_mask": [0, 0, 0]}], "no_supervised_token", "loss_mask is all zero"),
    # over-long samples
    "too long, truncate": BuildCase([chat("q", LONG)], "truncated", "", card={"max_length": 32, "overflow": "truncate"}),
    "too long, drop": BuildCase([chat("q", LONG)], "dropped_too_long", "tokens > max_length 32", card={"max_length": 32, "overflow": "drop"}),
    "too long, supervision cut off": BuildCase([chat(LONG, "x")], "no_supervised_token", "every supervised token lies beyond max_length 32", card={"max_length": 32}),
    # token ids out of the vocabulary
    "token id == vocab size": BuildCase([{"id": "bad", "input_ids": [1, 2, VOCAB], "loss_mask": [0, 1, 1]}], "malformed", f"outside the vocabulary [0, {VOCAB}), first {VOCAB} at position 2"),
    "token id 10 million": BuildCase([{"id": "bad", "input_ids": [10_000_000, 2], "loss_mask": [1, 1]}], "malformed", "outside the vocabulary"),
    "negative token id": BuildCase([{"id": "bad", "input_ids": [3, -1], "loss_mask": [1, 1]}], "malformed", "first -1 at position 1"),
    "float token ids": BuildCase([{"id": "bad", "input_ids": [1.5, 2.0], "loss_mask": [1, 1]}], "malformed", "must hold integers"),
    "empty input_ids": BuildCase([{"id": "bad", "input_ids": [], "loss_mask": []}], "malformed", "input_ids: is empty"),
    "loss_mask length mismatch": BuildCase([{"id": "bad", "input_ids": [1, 2, 3], "loss_mask": [1, 1]}], "malformed", "has 2 entries for 3 input_ids"),
    "loss_mask value 2": BuildCase([{"id": "bad", "input_ids": [1, 2, 3], "loss_mask": [0, 2, 1]}], "malformed", "0/1"),
    # NaN/inf states and capture failures (injected into the backend's output for row "bad")
    "NaN in an aux state": BuildCase([chat("q", "fine text")], "quarantined", "aux_hidden_states has NaN/inf at 1 token(s), first at token 1", poison="nan"),
    "inf in the final state": BuildCase([chat("q", "fine text")], "quarantined", "final_hidden_state has NaN/inf at 1 token(s), first at token 0", poison="inf"),
    "backend cannot capture": BuildCase([chat("q", "fine text")], "capture_failed", "partial prompt (injected)", poison="fail"),
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
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_text("\n".join(lines) + "\n")


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
    assert report.source["rows_read"] == len(rows) == accounted, f"rows vanished: {report.to_json()}"
    stored = open_dataset(out).sample_ids
    assert {"good-a", "good-b"} <= set(stored)
    assert verify_dataset(out).ok
    summary = report.summary()
    bad_index = 1
    if case.kind in ("written", "truncated"):
        assert not issues and "bad" in stored and report.samples_written == 3
        if case.kind == "truncated":
            assert report.truncated == 1
            item = next(i for i in open_dataset(out) if i["sample_id"] == "bad")
            assert item["input_ids"].shape[0] == case.card["max_length"] and bool(item["loss_mask"].any())
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
        list(iter_samples(src, tok, max_length=case.card.get("max_length", 1024), strict=True, vocab_size=VOCAB))


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
    raw["format_version"] = 2
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
    needs_hashes: bool = False  # only the sha256 check can see it (a plain open maps it happily)
    verify_match: str | None = None  # regex for verify's problem line, when it differs (verify hashes first)


READ_CASES: dict[str, ReadCase] = {
    "manifest from a newer format version": ReadCase(_newer_version, UnsupportedFormatError, "format version 2 is newer"),
    "manifest truncated (not JSON)": ReadCase(_manifest_truncated, FormatError, "not valid JSON"),
    "shard from another dataset": ReadCase(_foreign_shard, IntegrityError, "another dataset", verify_match="sha256 .* != manifest"),
    "corrupted shard data (one bit)": ReadCase(_flipped_data_byte, IntegrityError, "sha256", needs_hashes=True),
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
    extra = 2  # newer manifest at build time, foreign orphan shard at resume
    strict = sum(1 for c in BUILD_CASES.values() if c.kind in ("malformed", "no_supervised_token"))
    print(f"\nbad inputs tried: {build} build-path rows + {read} read-path rows + {extra} resume cases = {build + read + extra} "
          f"(plus {strict} strict-mode re-checks)")
    assert build + read + extra >= 30

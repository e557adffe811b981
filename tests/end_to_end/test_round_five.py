"""Round five (issue 47, "your own round"): answers, ids, caches and strangers' files, tried through the real entry points.

Every row is one attack of a kind issue 47 names, in a form no earlier table tries: a
server's answers as training targets (stop ids first, only stop ids, role markers spelled
out as text, merged and forged turns), what a ``/generate`` answer's JSON may hold, token
ids of the wrong dtype or one past the vocabulary, JSON forms no writer of ours makes
(duplicate keys, 5,000-digit integers, NaN, BOMs, CRLF), claims no hash covers
(``vocab_size``, the norm's eps), regeneration records torn, doubled or of another row,
files of trainers' layouts that are links, FIFOs or directories, caches holding hard
links, directories and forged entries, followed URLs in other spellings, and repo ids
and paths no system accepts. Each ends in a one-line named error or the correct result,
with nothing of the user's changed; the docs/LIMITS.md table "Round five" lists them.

Assertion tags (tests/fixtures/tally.py): SILENT: wrong data kept or served without a
word, LOST: a user's file changed or a sample dropped, ESCAPE: written outside, HANG:
past a time bound. A traceback (an exception other than the named ones) is tallied as such.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import stat
import struct
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

import hs_dataset
from hs_dataset.cli.main import main as cli_main
from hs_dataset.errors import FormatError, HsDatasetError, IntegrityError, RebuiltDatasetError, UsageError
from hs_dataset.formats.atomic import TEMP_PREFIX
from hs_dataset.formats.identity import identity_fingerprint
from hs_dataset.formats.metadata import DatasetMetadata
from hs_dataset.formats.reader import open_dataset
from hs_dataset.formats.regenerated import RegeneratedStore
from hs_dataset.formats.verify import verify_dataset
from hs_dataset.interop import ImportSettings, export_specforge, export_speculators, import_specforge, import_speculators
from hs_dataset.regenerate.answers import CUT_AFTER_STOP, CUT_AT_MAX_NEW_TOKENS, structure_tokens
from hs_dataset.regenerate.conversation import TurnRules
from hs_dataset.regenerate.generator import GenerationParams, GenerationResult, Generator, StreamingGenerator
from hs_dataset.regenerate.pump import ConversationPump
from hs_dataset.regenerate.turns import TurnRenderer
from hs_dataset.regenerate.windows import regenerate_in_windows
from hs_dataset.remote.cache import INDEX_NAME, ShardCache, cache_name
from hs_dataset.remote.follow import follow_dataset
from hs_dataset.remote.location import open_location
from hs_dataset.remote.publish import publish_dataset
from hs_dataset.sample import TokenizedSample
from hs_dataset.sources.messages import Conversation
from tests.fixtures.assertions import one_line
from tests.fixtures.damage import rewrite_shard
from tests.fixtures.samples import regenerated_record, write_small_dataset
from tests.fixtures.untrusted_dataset import SECRET, build, load_manifest, save_manifest, snapshot, split_header

MAX_NEW = 8
SETTINGS = ImportSettings(config="unit-test", aux_layer_ids=[2, 3, 4], num_hidden_layers=8)


# ============================================================================ shared, built once
@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A valid 5-sample dataset of 3 shards (bf16, 3 aux layers of 16): each case damages a copy."""
    return build(tmp_path_factory.mktemp("round5") / "base")


@pytest.fixture
def ds(base, tmp_path) -> Path:
    shutil.copytree(base, tmp_path / "ds")
    return tmp_path / "ds"


@pytest.fixture(scope="module")
def exports(base, tmp_path_factory) -> dict[str, Path]:
    """The base dataset exported once to each trainer's layout."""
    root = tmp_path_factory.mktemp("round5-exports")
    export_specforge(base, root / "specforge")
    export_speculators(base, root / "speculators")
    return {"specforge": root / "specforge", "speculators": root / "speculators"}


@pytest.fixture
def outside(tmp_path) -> Path:
    """A user's directory beside everything a case writes, with a canary file."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret.txt").write_bytes(SECRET)
    return out


def canary(outside: Path) -> tuple[bytes, int, int]:
    st = os.stat(outside / "secret.txt")
    return (outside / "secret.txt").read_bytes(), st.st_mtime_ns, stat.S_IMODE(st.st_mode)


def refused(call: Callable[[], object], kind: type[BaseException] = HsDatasetError, tag: str = "SILENT") -> BaseException:
    """The named error ``call`` raises; nothing raised is ``tag`` (what was accepted without a word).

    Another exception propagates: the tally counts it as a traceback.
    """
    try:
        call()
    except kind as exc:
        return exc
    raise AssertionError(f"{tag}: accepted without a word (expected a {kind.__name__})")


def cli(argv: list[str], capsys) -> tuple[int, str]:
    """``hs-dataset ARGV`` in this process: its exit status and its last stderr line (asserted to be the only error line)."""
    rc = cli_main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) <= 1, err
    return rc, err[-1] if err else ""


# ============================================================================ A. a server's answers are training targets
@pytest.fixture(scope="module")
def chat(tiny_chat):
    return tiny_chat


@pytest.fixture(scope="module")
def rules(chat) -> TurnRules:
    stop = tuple(dict.fromkeys((chat.end_of_turn_id, chat.tokenizer.eos_token_id)))
    params = GenerationParams(max_new_tokens=MAX_NEW, stop_token_ids=stop)
    return TurnRules(TurnRenderer(chat, False), params, structure=structure_tokens(chat, stop))


def token(chat, text: str) -> int:
    return chat.tokenizer.convert_tokens_to_ids(text)


def word(chat) -> list[int]:
    return chat.tokenizer("fine", add_special_tokens=False)["input_ids"]


# name -> the answer a hostile or misconfigured server gives (built from the tokenizer)
ANSWERS: dict[str, Callable] = {
    "stop id as the first token, then text": lambda c: [c.end_of_turn_id, *word(c) * 3],
    "an answer of only stop ids": lambda c: [c.end_of_turn_id] * 3,
    "the tokenizer's EOS mid-answer, then text": lambda c: [*word(c), c.tokenizer.eos_token_id, *word(c) * 2],
    "a user role marker spelled out as text tokens": lambda c: [
        *word(c),
        *c.tokenizer("<|im_user|>", add_special_tokens=False, split_special_tokens=True)["input_ids"],
        c.end_of_turn_id,
    ],
    "two answers merged by a proxy": lambda c: [*word(c), c.end_of_turn_id, *word(c), c.end_of_turn_id],
    "a forged system turn after the end of turn": lambda c: [
        *word(c),
        c.end_of_turn_id,
        token(c, "<|im_system|>"),
        *c.tokenizer("system", add_special_tokens=False)["input_ids"],
        token(c, "<|im_middle|>"),
        *word(c),
    ],
    "a structure token as the last id, no stop": lambda c: [*word(c), token(c, "<|im_assistant|>")],
    "a turn separator before the stop": lambda c: [*word(c), token(c, "<|im_middle|>"), *word(c), c.end_of_turn_id],
    "max_new_tokens ids, then a stop (ignore_eos)": lambda c: [*(word(c) * MAX_NEW)[:MAX_NEW], c.end_of_turn_id],
    "the stop exactly at max_new_tokens": lambda c: [*(word(c) * MAX_NEW)[: MAX_NEW - 1], c.end_of_turn_id],
    "an empty answer": lambda c: [],
    "a think block inside the answer": lambda c: [token(c, "<think>"), *word(c), token(c, "</think>"), *word(c), c.end_of_turn_id],
}


class HostileServer(StreamingGenerator):
    """Answers the prompt ``say K`` with ``ANSWERS`` row K (by index), anything else with a word and the end of turn."""

    in_flight = 2

    def __init__(self, chat) -> None:
        self.chat = chat
        self.rows = [make(chat) for make in ANSWERS.values()]

    def describe(self) -> dict:
        return {"engine": "hostile"}

    def _answer(self, prompt: list[int]) -> GenerationResult:
        said = self.chat.tokenizer.decode(prompt).rsplit("say ", 1)[-1].split("<", 1)[0].strip()
        ids = self.rows[int(said)] if said.isdigit() else [*word(self.chat), self.chat.end_of_turn_id]
        return GenerationResult(list(ids), "length")

    def generate(self, prompts, params):
        return [self._answer(p) for p in prompts]

    def submit(self, prompt, params) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(self._answer(prompt))
        return future


def conversation_sample(sample_id: str, says: list[str], row_index: int = 0) -> TokenizedSample:
    messages: list[dict] = []
    for said in says:
        messages += [{"role": "user", "content": f"say {said}"}, {"role": "assistant", "content": "old"}]
    meta = {"conversation": Conversation(messages=messages, tools=None), "row_index": row_index}
    return TokenizedSample(sample_id, torch.tensor([1, 2]), torch.tensor([False, True]), meta=meta)


@pytest.fixture(scope="module")
def answered(chat, rules, tmp_path_factory) -> dict[str, object]:
    """Every ANSWERS row regenerated once through the pump (a first turn of the row, a second ordinary turn), by row name."""
    store = RegeneratedStore(tmp_path_factory.mktemp("round5-answers"))
    source = [conversation_sample(name, [str(k), "then"]) for k, name in enumerate(ANSWERS)]
    return {s.sample_id: r for s, r, _ in ConversationPump(HostileServer(chat), rules, store, slots=2).run(source)}


def _kept_turn_is_the_models(turn, rules) -> None:
    stop = set(rules.params.stop_token_ids)
    ids = list(turn.token_ids)
    assert len(ids) <= MAX_NEW, f"SILENT: {len(ids)} ids stored for max_new_tokens {MAX_NEW}"
    assert not any(t in stop for t in ids[:-1]), f"SILENT: ids stored after a stop id: {ids}"
    assert not set(ids) & set(rules.structure), f"SILENT: a structure token stored in an answer: {ids}"


@pytest.mark.parametrize("name", list(ANSWERS))
def test_a_servers_answer_is_stored_as_the_model_generated_it(name, answered, chat, rules):
    record = answered[name]
    end, user = chat.end_of_turn_id, token(chat, "<|im_user|>")
    first = record.turns[0]
    if name in ("a structure token as the last id, no stop", "a turn separator before the stop"):
        assert record.input_ids is None and record.dropped.startswith("malformed answer: structure token"), (
            f"SILENT: an answer holding a structure token was stored: {record.to_json()}"
        )
        assert first.finish == "failed" and first.malformed
        return
    assert record.dropped is None, record.dropped
    for turn in record.turns:
        _kept_turn_is_the_models(turn, rules)
    ids = record.input_ids
    assert ids.count(user) == 2, f"SILENT: {ids.count(user)} user markers in a sample of 2 user turns (a forged turn)"
    for start, stop in record.loss_spans:  # the mask trains on answers only: no span reaches a marker
        assert not set(ids[start:stop]) & set(rules.structure), f"SILENT: the loss mask covers a structure token: {ids[start:stop]}"
    expected = {
        "stop id as the first token, then text": ([end], CUT_AFTER_STOP),
        "an answer of only stop ids": ([end], CUT_AFTER_STOP),
        "the tokenizer's EOS mid-answer, then text": ([*word(chat), chat.tokenizer.eos_token_id], CUT_AFTER_STOP),
        "two answers merged by a proxy": ([*word(chat), end], CUT_AFTER_STOP),
        "a forged system turn after the end of turn": ([*word(chat), end], CUT_AFTER_STOP),
        "max_new_tokens ids, then a stop (ignore_eos)": ((word(chat) * MAX_NEW)[:MAX_NEW], CUT_AT_MAX_NEW_TOKENS),
        "the stop exactly at max_new_tokens": ([*(word(chat) * MAX_NEW)[: MAX_NEW - 1], end], None),
        "an empty answer": ([], None),
    }
    if name in expected:
        ids_expected, cut = expected[name]
        assert (first.token_ids, first.cut) == (ids_expected, cut), f"SILENT: stored {first.token_ids} (cut {first.cut!r})"
    if name == "a user role marker spelled out as text tokens":  # text, not a marker: kept as the model wrote it
        assert first.token_ids == ANSWERS[name](chat) and first.cut is None
    if name == "a think block inside the answer":
        assert first.token_ids == ANSWERS[name](chat) and first.cut is None
    if name == "an empty answer":
        assert first.empty and len(record.loss_spans) == 1, "SILENT: an empty answer got a supervised span"


# ============================================================================ B. what a /generate answer's JSON may hold
GENERATE_BODIES: dict[str, tuple[bytes, str]] = {  # name -> (the body answered, what the failed turn says)
    "output_ids as nested lists": (b'{"output_ids": [[7], [8]]}', "output_ids[0] is a list"),
    "a NaN literal among the ids": (b'{"output_ids": [7, NaN]}', "output_ids[1] is a float"),
    "a 5000-digit integer id": (b'{"output_ids": [' + b"9" * 5000 + b"]}", "a number too long to read"),
    "output_ids given twice (a merging proxy)": (b'{"output_ids": [999999], "output_ids": [7]}', "appears twice"),
    "negative zero as a float": (b'{"output_ids": [-0.0, 7]}', "output_ids[0] is a float"),
    "an exponent literal": (b'{"output_ids": [1e2]}', "output_ids[0] is a float"),
    "output_ids an object": (b'{"output_ids": {"0": 7}}', "output_ids is a dict"),
}


class _GenerateStub(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = GENERATE_BODIES[list(GENERATE_BODIES)[int(self.path.split("/")[1])]][0]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def generate_stub():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _GenerateStub)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.mark.parametrize("name", list(GENERATE_BODIES))
def test_a_generate_answer_that_is_no_token_ids_is_a_failed_turn(name, generate_stub):
    from hs_dataset.capture.sglang.generate import SGLangGenerator

    generator = SGLangGenerator([f"{generate_stub}/{list(GENERATE_BODIES).index(name)}"], retries=0, vocab_size=1000, request_timeout_s=10)
    try:
        (result,) = generator.generate([[1, 2, 3]], GenerationParams(max_new_tokens=4))
    finally:
        generator.close()
    assert result.finish == "failed" and not result.token_ids, f"SILENT: {name} was taken as an answer: {result}"
    assert GENERATE_BODIES[name][1] in result.error and "\n" not in result.error, result.error


# ============================================================================ C. manifests and shard headers: forms no writer makes, claims no hash covers
def manifest_text(pattern: str, replacement: str) -> Callable[[Path], None]:
    """Edit the manifest as text (forms json.dumps never writes): ``pattern`` (a regex, first match) -> ``replacement``."""

    def damage(root: Path) -> None:
        path = root / "manifest.json"
        text, n = re.subn(pattern, replacement, path.read_text(), count=1, flags=re.S)
        assert n == 1, pattern
        path.write_text(text)

    return damage


def claim(**fields: object) -> Callable[[Path], None]:
    """Set metadata fields and re-hash the identity, as a writer with a wrong claim would: only the claim is wrong."""

    def damage(root: Path) -> None:
        raw = load_manifest(root)
        for key, value in fields.items():
            target = raw["metadata"]
            *parents, last = key.split(".")
            for parent in parents:
                target = target.setdefault(parent, {})
            target[last] = value
        raw["identity"] = identity_fingerprint(DatasetMetadata.from_json(raw["metadata"], "test"))
        save_manifest(root, raw)

    return damage


def first_id(value: int) -> Callable[[Path], None]:
    """Shard 0's first token id becomes ``value`` (re-hashed: only the id is wrong)."""

    def damage(root: Path) -> None:
        def mutate(data: bytes) -> bytes:
            header, body = split_header(data)
            start = header["input_ids"]["data_offsets"][0]
            head = len(data) - len(body)
            return data[: head + start] + struct.pack("<q", value) + data[head + start + 8 :]

        rewrite_shard(root, 0, mutate)

    return damage


def both(*damages: Callable[[Path], None]) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        for one in damages:
            one(root)

    return damage


def header_text(pattern: str, replacement: str) -> Callable[[Path], None]:
    """Edit shard 0's safetensors header as text (re-padded, re-hashed)."""

    def damage(root: Path) -> None:
        def mutate(data: bytes) -> bytes:
            (n,) = struct.unpack("<Q", data[:8])
            text, count = re.subn(pattern, replacement, data[8 : 8 + n].decode(), count=1)
            assert count == 1, pattern
            raw = text.encode() + b" " * (-len(text.encode()) % 8)
            return struct.pack("<Q", len(raw)) + raw + data[8 + n :]

        rewrite_shard(root, 0, mutate)

    return damage


# name -> (damage, what the verify problem and the reader's error both say); None: the dataset still reads (correct handling)
MANIFESTS: dict[str, tuple[Callable[[Path], None], str | None]] = {
    "aux_layer_ids twice, the first [4, 3, 2]": (
        manifest_text(r'"aux_layer_ids":', '"aux_layer_ids": [4, 3, 2], "aux_layer_ids":'),
        "key 'aux_layer_ids' appears twice",
    ),
    "shards twice, the first empty": (manifest_text(r'"shards":', '"shards": [], "shards":'), "key 'shards' appears twice"),
    "a shard's file twice, the first ../x": (
        manifest_text(r'"file": "shard-000000', '"file": "../x.safetensors", "file": "shard-000000'),
        "key 'file' appears twice",
    ),
    "a 5000-digit integer as a shard's bytes": (manifest_text(r'"bytes": \d+', '"bytes": ' + "9" * 5000), "a number too long to read"),
    "a 5000-digit integer as num_hidden_layers": (
        manifest_text(r'"num_hidden_layers": \d+', '"num_hidden_layers": ' + "7" * 5000),
        "a number too long to read",
    ),
    "final_norm.eps NaN": (manifest_text(r'"eps": [0-9e.-]+', '"eps": NaN'), r"final_norm.eps nan is not a small non-negative number"),
    "final_norm.eps Infinity": (manifest_text(r'"eps": [0-9e.-]+', '"eps": Infinity'), "final_norm.eps inf is not"),
    "final_norm.eps negative": (manifest_text(r'"eps": [0-9e.-]+', '"eps": -0.5'), "final_norm.eps -0.5 is not"),
    "vocab_size 0 (the id check switched off)": (claim(vocab_size=0), r"metadata.vocab_size 0 is outside \[1, 16777216\]"),
    "vocab_size negative": (claim(vocab_size=-5), r"metadata.vocab_size -5 is outside"),
    "vocab_size 10**13 with an id of 10**12": (
        both(claim(vocab_size=10**13), first_id(10**12)),
        r"metadata.vocab_size 10000000000000 is outside",
    ),
    "tokenizer.vocab_size 0": (claim(**{"tokenizer.vocab_size": 0}), r"metadata.tokenizer.vocab_size 0 is outside"),
    "an id equal to the recorded vocab_size": (
        both(claim(vocab_size=50_000), first_id(50_000)),
        r"input_ids\[0\] = 50000 is outside the vocabulary \[0, 50000\)",
    ),
    "aux_layer_ids [-0.0, 3, 4]": (manifest_text(r'"aux_layer_ids": \[\s*2,', '"aux_layer_ids": [-0.0,'), "aux_layer_ids must be"),
    "aux_layer_ids [NaN, 3, 4]": (manifest_text(r'"aux_layer_ids": \[\s*2,', '"aux_layer_ids": [NaN,'), "aux_layer_ids must be"),
    "aux_layer_ids [true, 3, 4]": (manifest_text(r'"aux_layer_ids": \[\s*2,', '"aux_layer_ids": [true,'), "aux_layer_ids must be"),
    "dtype with a Cyrillic o (bfl-o-at16)": (claim(dtype="bfl\u043eat16"), "is not a hidden-state dtype"),
    "a UTF-8 BOM before the manifest": (
        lambda r: (r / "manifest.json").write_bytes(b"\xef\xbb\xbf" + (r / "manifest.json").read_bytes()),
        "BOM",
    ),
    "the manifest in UTF-16": (
        lambda r: (r / "manifest.json").write_bytes((r / "manifest.json").read_text().encode("utf-16")),
        "not valid JSON",
    ),
    "the manifest with CRLF line ends": (
        lambda r: (r / "manifest.json").write_bytes((r / "manifest.json").read_bytes().replace(b"\n", b"\r\n")),
        None,
    ),
    "a shard header with a 5000-digit shape": (header_text(r'"shape":\[', '"shape":[' + "9" * 5000 + ","), "a number too long to read"),
    "a shard header with NaN in a shape": (header_text(r'"shape":\[', '"shape":[NaN,'), "not non-negative integers"),
}


@pytest.mark.parametrize("name", list(MANIFESTS))
def test_a_manifest_or_header_in_a_form_no_writer_makes_is_one_line(name, ds, outside):
    damage, says = MANIFESTS[name]
    before = canary(outside)
    damage(ds)
    result = verify_dataset(ds)
    if says is None:
        assert result.ok, result.problems
        assert [row["sample_id"] for row in open_dataset(ds)] == [f"s{i}" for i in range(5)]
        return
    assert not result.ok, f"SILENT: verify said {result.summary()}"
    assert any(re.search(says, p) and "\n" not in p for p in result.problems), result.problems

    def read_everything() -> None:
        data = open_dataset(ds)
        for _ in data:
            pass
        data.final_norm()
        if name == "an id equal to the recorded vocab_size":  # a reader serves ids as stored; an export checks them
            export_specforge(ds, ds.parent / "exported")

    error = refused(read_everything)
    assert re.search(says, one_line(error)), error
    assert canary(outside) == before, "ESCAPE: a file outside the dataset changed"


# ============================================================================ D/E. trainers' files from strangers: ids, names, links
def ckpt(path: Path, tokens: int = 4, hidden: int = 16, **tensors: object) -> None:
    """A SpecForge file of ``tokens`` tokens (3 aux layers), with ``tensors`` replacing the defaults."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "input_ids": torch.arange(10, 10 + tokens).reshape(1, tokens),
        "loss_mask": torch.ones(1, tokens, dtype=torch.int64),
        "aux_hidden_state": torch.randn(1, tokens, 3 * hidden),
        "hidden_state": torch.randn(1, tokens, hidden),
    }
    data.update(tensors)
    torch.save(data, path)


def ckpt_ids(ids: torch.Tensor) -> Callable[[Path], None]:
    return lambda src: ckpt(src / "data_0.ckpt", input_ids=ids)


def beside(make_odd: Callable[[Path], None]) -> Callable[[Path], None]:
    """Two good files (data_0, data_2) and something odd under the name data_1.ckpt."""

    def setup(src: Path) -> None:
        ckpt(src / "data_0.ckpt")
        ckpt(src / "data_2.ckpt")
        make_odd(src / "data_1.ckpt")

    return setup


def export_sample_id(value: object) -> Callable[[Path], None]:
    """In a copy of our own SpecForge export: data_1's stored sample_id becomes ``value``."""

    def setup(src: Path) -> None:
        path = next(src.rglob("data_1.ckpt"))
        data = torch.load(path, weights_only=True)
        data["sample_id"] = value
        torch.save(data, path)

    return setup


def hard_link_from_outside(src: Path) -> None:
    ckpt(src.parent / "kept-elsewhere.ckpt")
    os.link(src.parent / "kept-elsewhere.ckpt", src / "data_0.ckpt")


# name -> (setup of the SpecForge directory, whether it starts from our export, what the refusal says; None: imported)
SPECFORGE: dict[str, tuple[Callable[[Path], None], bool, str | None]] = {
    "float input_ids (5.5 would be stored as 5)": (
        ckpt_ids(torch.tensor([[10.5, 11.7, 12.2, 13.9]])),
        False,
        "input_ids holds float32 values",
    ),
    "bool input_ids": (ckpt_ids(torch.tensor([[True, False, True, True]])), False, "input_ids holds bool values"),
    "complex input_ids": (ckpt_ids(torch.tensor([[10 + 1j, 11, 12, 13]])), False, "input_ids holds complex64 values"),
    "float64 NaN input_ids": (ckpt_ids(torch.tensor([[float("nan"), 11.0, 12.0, 13.0]], dtype=torch.float64)), False, "float64 values"),
    "int8 input_ids holding -1": (ckpt_ids(torch.tensor([[-1, 11, 12, 13]], dtype=torch.int8)), False, r"input_ids\[0\] = -1 is outside"),
    "uint8 input_ids": (ckpt_ids(torch.tensor([[250, 11, 12, 13]], dtype=torch.uint8)), False, None),
    "input_ids of a batch of two": (ckpt_ids(torch.arange(8).reshape(2, 4)), False, r"input_ids has shape \(2, 4\), expected \[T\]"),
    "a sample of zero tokens": (lambda src: ckpt(src / "data_0.ckpt", tokens=0), False, r"input_ids has shape \(1, 0\)"),
    "a dangling link named data_1.ckpt": (beside(lambda p: os.symlink("/nonexistent/data.ckpt", p)), False, "is a symbolic link"),
    "a link loop named data_1.ckpt": (beside(lambda p: os.symlink(p.name, p)), False, "is a symbolic link"),
    "a FIFO named data_1.ckpt": (beside(os.mkfifo), False, "not a regular file"),
    "a directory named data_1.ckpt": (beside(lambda p: p.mkdir()), False, "not a regular file"),
    "a hard link to a file kept elsewhere": (hard_link_from_outside, False, None),
    "a ckpt cut at 300 bytes": (
        lambda src: (ckpt(src / "data_0.ckpt"), (src / "data_0.ckpt").write_bytes((src / "data_0.ckpt").read_bytes()[:300])),
        False,
        "cannot be read with torch.load",
    ),
    "an empty ckpt": (lambda src: (src / "data_0.ckpt").write_bytes(b""), False, "cannot be read with torch.load"),
    "an export's sample_id of 5000 characters": (export_sample_id("y" * 5000), True, r"data_1\.ckpt: sample id must be a non-empty string"),
    "an export's sample_id that is a number": (export_sample_id(7), True, r"data_1\.ckpt: sample id must be .*, got 7"),
    "an export's empty sample_id": (export_sample_id(""), True, r"data_1\.ckpt: sample id must be .*, got ''"),
}


@pytest.mark.parametrize("name", list(SPECFORGE))
def test_a_specforge_file_from_a_stranger_is_refused_by_name_or_imported_right(name, base, exports, tmp_path, outside):
    setup, from_export, says = SPECFORGE[name]
    src = tmp_path / "sf"
    if from_export:
        shutil.copytree(exports["specforge"], src)
    else:
        src.mkdir()
    setup(src)
    before = canary(outside)
    start = time.monotonic()
    if says is None:
        report = import_specforge(src, tmp_path / "dest", SETTINGS)
        got = [s["input_ids"].tolist() for s in open_dataset(tmp_path / "dest")]
        written = [torch.load(p, weights_only=True)["input_ids"].reshape(-1).tolist() for p in sorted(src.rglob("*.ckpt"))]
        assert report.samples_written == len(written) and got == written, f"SILENT: stored {got}, the files hold {written}"
    else:
        text = one_line(refused(lambda: import_specforge(src, tmp_path / "dest", SETTINGS)))
        assert re.search(says, text), text
        assert str(src) in text, f"the error names no file: {text}"
        only_true_samples(tmp_path / "dest", base if from_export else None)
    assert time.monotonic() - start < 30, "HANG: the import waited on a file"
    assert canary(outside) == before, "ESCAPE: a file outside changed"


def only_true_samples(dest: Path, truth: Path | None) -> None:
    """What a refused import left (the samples before the refused file: an import resumes) is only ``truth``'s own samples."""
    if not (dest / "manifest.json").exists():
        return
    assert truth is not None, f"SILENT: a refused import left a dataset: {sorted(os.listdir(dest))}"
    known = {row["sample_id"]: row["input_ids"] for row in open_dataset(truth)}
    for row in open_dataset(dest):
        sid = row["sample_id"]
        assert sid in known and torch.equal(row["input_ids"], known[sid]), f"SILENT: the refused import stored {sid!r}"


def _arrow_edit(src: Path, edit: Callable) -> None:
    """Rewrite the speculators Arrow dataset at ``src`` through ``edit(dataset) -> dataset`` (hidden states kept)."""
    import datasets

    data = edit(datasets.load_from_disk(str(src)))
    data.save_to_disk(str(src.parent / "arrow"))
    for entry in src.iterdir():
        if entry.is_file():
            entry.unlink()
    for entry in (src.parent / "arrow").iterdir():
        shutil.move(str(entry), src / entry.name)


def _sample_ids(values: list[object]) -> Callable[[Path], None]:
    def setup(src: Path) -> None:
        import datasets

        _arrow_edit(src, lambda d: d.remove_columns("sample_id").add_column("sample_id", values, feature=datasets.Value("string")))

    return setup


def _float_ids(src: Path) -> None:
    import datasets

    def edit(data):
        data = data.map(lambda row: {"input_ids": [float(t) + 0.25 for t in row["input_ids"]]})
        return data.cast_column("input_ids", datasets.Sequence(datasets.Value("float32")))

    _arrow_edit(src, edit)


def _float_token_ids(src: Path) -> None:
    from safetensors.torch import load_file, save_file

    path = src / "hidden_states" / "hs_1.safetensors"
    tensors = load_file(str(path))
    tensors["token_ids"] = tensors["token_ids"].to(torch.float32) + 0.25
    save_file(tensors, str(path))


SPECULATORS: dict[str, tuple[Callable[[Path], None], str | None]] = {
    "float input_ids in the Arrow rows": (_float_ids, "input_ids holds float32 values"),
    "float token_ids in a states file": (_float_token_ids, r"hs_1\.safetensors: token_ids holds float32 values"),
    "a sample_id of None": (_sample_ids([None, "s1", "s2", "s3", "s4"]), r"row 0: sample id must be .*, got None"),
    "one sample_id on two rows of different data": (_sample_ids(["s0", "s0", "s2", "s3", "s4"]), "in two files with different content"),
    "a states file that is a link loop": (
        lambda src: (
            (src / "hidden_states" / "hs_1.safetensors").unlink(),
            os.symlink("hs_1.safetensors", src / "hidden_states" / "hs_1.safetensors"),
        ),
        "is a symbolic link",
    ),
}


@pytest.mark.parametrize("name", list(SPECULATORS))
def test_a_speculators_directory_from_a_stranger_is_refused_by_name(name, base, exports, tmp_path):
    setup, says = SPECULATORS[name]
    src = tmp_path / "spec"
    shutil.copytree(exports["speculators"], src, symlinks=True)
    setup(src)
    text = one_line(refused(lambda: import_speculators(src, tmp_path / "dest", SETTINGS)))
    assert re.search(says, text), text
    assert str(src) in text, f"the error names no file: {text}"
    only_true_samples(tmp_path / "dest", base)


# name -> (the destination, made from tmp_path and the user's file; the command)
DESTINATIONS: dict[str, tuple[Callable[[Path, Path], Path], str]] = {
    "export into a user's file": (lambda tmp, user: user, "export"),
    "export under a user's file": (lambda tmp, user: user / "sub", "export"),
    "export into a link loop": (lambda tmp, user: (os.symlink("loop", tmp / "loop"), tmp / "loop")[1], "export"),
    "import under a user's file": (lambda tmp, user: user / "sub", "import"),
    "import into a dangling link": (lambda tmp, user: (os.symlink(tmp / "nowhere", tmp / "dangling"), tmp / "dangling")[1], "import"),
}


@pytest.mark.parametrize("name", list(DESTINATIONS))
def test_an_output_that_cannot_be_a_directory_is_exit_2_in_one_line(name, base, exports, tmp_path, capsys):
    where, command = DESTINATIONS[name]
    user = tmp_path / "notes.txt"
    user.write_bytes(SECRET)
    dest = where(tmp_path, user)
    if command == "export":
        argv = ["export", "specforge", str(base), str(dest)]
    else:
        argv = ["import", "specforge", str(exports["specforge"]), str(dest), "--config", "unit-test", "--aux-layer-ids", "2", "3", "4"]
    rc, err = cli(argv, capsys)
    assert rc == 2, (rc, err)
    assert err.startswith(f"hs-dataset {command}: error: ") and str(dest) in err, err
    assert "Errno" not in err, f"a bare OSError: {err}"
    assert user.read_bytes() == SECRET and user.is_file(), "LOST: the user's file changed"


# ============================================================================ G. regeneration records a build resumes from
GOOD = regenerated_record()


def line(*records: dict) -> bytes:
    return (json.dumps({"records": list(records)}) + "\n").encode()


good = regenerated_record


# name -> (the file's bytes, what the refusal says; None: read, with the sample ids kept)
RECORDS: dict[str, tuple[bytes, str | list[str]]] = {
    "a torn last line (a kill mid-append)": (line(GOOD) + line(good(sample_id="b"))[:-40], ["a"]),
    "a UTF-8 BOM before the first line": (b"\xef\xbb\xbf" + line(GOOD), ["a"]),
    "CRLF line ends": (line(GOOD, good(sample_id="b")).replace(b"\n", b"\r\n"), ["a", "b"]),
    "a 5000-digit id": (line(GOOD).replace(b"[1, 2, 5, 6]", b"[1, 2, " + b"9" * 5000 + b", 6]"), r"line 1 is not JSON \(a number too long"),
    "input_ids twice, the first with 999999999": (
        line(GOOD).replace(b'"input_ids": [1, 2, 5, 6]', b'"input_ids": [1, 2, 999999999, 6], "input_ids": [1, 2, 5, 6]'),
        r"line 1 is not JSON \(key 'input_ids' appears twice",
    ),
    "one sample id on two lines": (line(GOOD) + line(good(input_ids=[1, 2, 7, 6])), "line 2 stores sample 'a' a second time"),
    "an id equal to the model's vocab_size": (
        line(good(input_ids=[1, 2, 1000, 6])),
        r"input_ids\[2\] = 1000 is outside the vocabulary \[0, 1000\)",
    ),
    "ids as nested lists": (line(good(input_ids=[1, 2, [5], 6])), "input_ids must be a list of integers"),
    "a loss span past the ids": (line(good(loss_spans=[[2, 99]])), r"loss_spans holds \[2, 99\], not a \[start, stop\)"),
    "a line nested 100000 deep": (b'{"records": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", "line 1 is JSON nested too deeply"),
}


@pytest.mark.parametrize("name", list(RECORDS))
def test_a_regeneration_record_a_build_resumes_from_is_read_right_or_refused(name, tmp_path):
    data, expected = RECORDS[name]
    path = tmp_path / "regenerated.jsonl"
    path.write_bytes(data)
    if isinstance(expected, list):
        store = RegeneratedStore(tmp_path, vocab_size=1000)
        assert sorted(store.records) == expected, f"SILENT: resumed from {sorted(store.records)}"
        assert all(store.get(sid)["input_ids"] == GOOD["input_ids"] for sid in expected)
        return
    text = one_line(refused(lambda: RegeneratedStore(tmp_path, vocab_size=1000), FormatError))
    assert text.startswith(f"{path}: ") and re.search(expected, text), text
    assert path.read_bytes() == data, "LOST: a refused record file was changed"


def _regenerate(kind: str, chat, rules, root: Path, samples: list[TokenizedSample]) -> list:
    store = RegeneratedStore(root)
    if kind == "pump":
        return list(ConversationPump(HostileServer(chat), rules, store, slots=2).run(samples))

    class Batch(Generator):
        def __init__(self) -> None:
            self.server = HostileServer(chat)

        def describe(self) -> dict:
            return {"engine": "hostile batch"}

        def generate(self, prompts, params):
            return self.server.generate(prompts, params)

    return list(regenerate_in_windows(samples, 2, Batch(), rules, store))


@pytest.mark.parametrize("kind", ["pump", "windows"])
def test_a_stored_record_of_another_rows_conversation_is_refused_on_resume(kind, chat, rules, tmp_path):
    """pump: the source row edited between runs (position ids); windows: two records' sample ids swapped in the file."""
    first = [conversation_sample("src:0", ["hello"]), conversation_sample("src:1", ["world"], row_index=1)]
    _regenerate(kind, chat, rules, tmp_path, first)
    path = tmp_path / "regenerated.jsonl"
    if kind == "pump":
        again = [conversation_sample("src:0", ["an edited row"]), first[1]]
    else:
        chunk = json.loads(path.read_bytes())
        for record in chunk["records"]:
            record["sample_id"] = {"src:0": "src:1", "src:1": "src:0"}[record["sample_id"]]
        path.write_text(json.dumps(chunk) + "\n")
        again = first
    kept = path.read_bytes()
    text = one_line(refused(lambda: _regenerate(kind, chat, rules, tmp_path, again), FormatError))
    assert text.startswith(f"{path}: sample 'src:0': the stored record is of another conversation than the source row's"), f"SILENT: {text}"
    assert path.read_bytes() == kept, "LOST: the record file changed"


# ============================================================================ H. caches that trust no stat, no name and no link
@pytest.fixture(scope="module")
def published(tmp_path_factory) -> tuple[str, Path]:
    """(url, local dataset): 8 samples in 4 shards published to a file:// prefix (the code of s3://), read by every cache case."""
    root = tmp_path_factory.mktemp("round5-store")
    local = root / "local"
    write_small_dataset(local)
    url = f"file://{root}/bucket/ds"
    publish_dataset(local, open_location(url))
    return url, local


def cache_name_of(local: Path) -> str:
    """The name the cache keeps the dataset's first shard under (the cache's own naming)."""
    return cache_name(hs_dataset.open_dataset(local).manifest.shards[0])


def user_copy(local: Path, user: Path, flip: bool = False) -> Path:
    """A user's own file holding shard 0's bytes (one byte flipped with ``flip``), mode 0o640."""
    data = bytearray((local / hs_dataset.open_dataset(local).manifest.shards[0].file).read_bytes())
    if flip:
        data[-3] ^= 0xFF
    path = user / "kept.safetensors"
    path.write_bytes(bytes(data))
    os.chmod(path, 0o640)
    return path


def plant_hard_link(flip: bool) -> Callable:
    def plant(cache: Path, local: Path, user: Path) -> None:
        ShardCache(cache, 1 << 24)
        os.link(user_copy(local, user, flip), cache / cache_name_of(local))

    return plant


def replace_by_rename(cache: Path, local: Path, user: Path) -> None:
    """Shard 0 cached, then replaced (a new inode under its name) by a same-size file of other bytes."""
    data = hs_dataset.open_dataset(f"file://{local.parent}/bucket/ds", cache_dir=cache, prefetch_shards=0)
    data[0]
    data.close()
    path = cache / cache_name_of(local)
    other = bytearray(path.read_bytes())
    other[-3] ^= 0xFF
    (cache / "swap").write_bytes(bytes(other))
    os.replace(cache / "swap", path)


def temp_under_live_pid(make: Callable[[Path], None]) -> Callable:
    def plant(cache: Path, local: Path, user: Path) -> None:
        ShardCache(cache, 1 << 24)
        make(cache / f"{TEMP_PREFIX}{os.getpid()}-0000abcd-{cache_name_of(local)}")

    return plant


def index_text(text: str) -> Callable:
    def plant(cache: Path, local: Path, user: Path) -> None:
        ShardCache(cache, 1 << 24)
        (cache / INDEX_NAME).write_text(text)

    return plant


def forged_entry_for_a_planted_file(cache: Path, local: Path, user: Path) -> None:
    """Other bytes under the cache name, with an index entry forged to vouch for them (inode, size, mtime, boot)."""
    from hs_dataset.remote.cache import _boot_time

    ShardCache(cache, 1 << 24)
    path = cache / cache_name_of(local)
    path.write_bytes(user_copy(local, user, flip=True).read_bytes())
    st = os.stat(path)
    entry = {"ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "boot": _boot_time(), "used": 0}
    (cache / INDEX_NAME).write_text(json.dumps({"format": "hs_dataset-cache", "version": 1, "files": {path.name: entry}}))


# name -> (plant(cache, local, user dir), the refusal; None: shard 0 is read right)
CACHES: dict[str, tuple[Callable, str | None]] = {
    "shard 0 replaced by rename with same-size other bytes": (replace_by_rename, "a file the cache did not write lies under a cache name"),
    "a user's file with the right bytes hard-linked under the cache name": (plant_hard_link(False), None),
    "a user's file with other bytes hard-linked under the cache name": (plant_hard_link(True), "a file the cache did not write"),
    "an index entry forged for planted bytes": (forged_entry_for_a_planted_file, None),
    "a download temp under a live pid that links to a user's file": (
        temp_under_live_pid(lambda p: os.symlink(p.parent.parent / "user" / "kept.safetensors", p)),
        None,
    ),
    "a directory under a download temp's name": (temp_under_live_pid(lambda p: (p.mkdir(), (p / "notes.txt").write_bytes(SECRET))), None),
    "an index with a key given twice": (index_text('{"format": "hs_dataset-cache", "format": "x", "version": 1, "files": {}}'), None),
    "an index with a 5000-digit version": (index_text('{"format": "hs_dataset-cache", "version": ' + "9" * 5000 + ', "files": {}}'), None),
}


@pytest.mark.parametrize("name", list(CACHES))
def test_a_cache_holding_what_it_did_not_write_serves_only_checked_bytes(name, published, tmp_path):
    url, local = published
    plant, says = CACHES[name]
    user = tmp_path / "user"
    user.mkdir()
    user_copy(local, user)
    cache = tmp_path / "cache"
    plant(cache, local, user)
    mine = {p.name: (p.read_bytes(), stat.S_IMODE(p.stat().st_mode)) for p in user.iterdir()}
    expected = hs_dataset.open_dataset(local)[0]["aux_hidden_states"]
    data = hs_dataset.open_dataset(url, cache_dir=cache, prefetch_shards=0)
    try:
        if says is None:
            assert torch.equal(data[0]["aux_hidden_states"], expected), "SILENT: the cache served other bytes"
        else:
            assert says in one_line(refused(lambda: data[0], IntegrityError))
    finally:
        data.close()
    now = {p.name: (p.read_bytes(), stat.S_IMODE(p.stat().st_mode)) for p in user.iterdir()}
    assert now == mine, "LOST: a user's file (its bytes or its mode) was changed by the cache"
    if name == "a directory under a download temp's name":
        assert next(cache.glob(f"{TEMP_PREFIX}*")).joinpath("notes.txt").read_bytes() == SECRET, "LOST: the cache emptied a directory"


def _loop(tmp: Path) -> Path:
    os.symlink("loop", tmp / "loop")
    return tmp / "loop"


def _link_to_user_file(tmp: Path) -> Path:
    os.symlink(tmp / "outside" / "secret.txt", tmp / "link")
    return tmp / "link"


@pytest.mark.parametrize(
    ("name", "make", "says"),
    [
        ("a NUL byte in cache_dir", lambda tmp: str(tmp / "cache") + "\x00x", "holds a NUL byte"),
        ("a cache_dir under /proc", lambda tmp: "/proc/self/hs-dataset-cache", "cache_dir cannot be created"),
        ("a cache_dir that is a link loop", _loop, "symbolic link that leads nowhere"),
        ("a cache_dir that is a link to a user's file", _link_to_user_file, "is a file"),
    ],
    ids=["nul-byte", "under-proc", "link-loop", "link-to-a-file"],
)
def test_a_cache_dir_that_cannot_be_one_is_a_named_error(name, make, says, published, tmp_path, outside):
    url, _local = published
    before = canary(outside)
    cache_dir = make(tmp_path)
    for entry in (
        lambda: hs_dataset.open_dataset(url, cache_dir=cache_dir),
        lambda: follow_dataset(url, idle_timeout_s=0, cache_dir=cache_dir),
    ):
        error = refused(entry, UsageError)
        assert says in one_line(error), error
    assert canary(outside) == before, "LOST: the user's file changed"


def test_verify_url_with_a_cache_dir_that_cannot_be_made_is_exit_2_in_one_line(published, capsys, monkeypatch):
    url, _local = published
    monkeypatch.setenv("HS_DATASET_CACHE_DIR", "/proc/self/hs-dataset-cache")
    rc, err = cli(["verify", url], capsys)
    assert rc == 2 and err.startswith("hs-dataset verify: error: ") and "Errno" not in err, (rc, err)


# ============================================================================ I. following a bucket: spellings of one prefix, a rebuilt one
def spelled(transform: Callable[[str, Path], str]) -> Callable[[str, Path], list[str]]:
    """The URL and another spelling of it (``transform(url, store root)``), followed together."""
    return lambda url, root: [url, transform(url, root)]


FOLLOWED: dict[str, Callable[[str, Path], list[str]]] = {
    "with a ./ segment": spelled(lambda url, root: url.replace("/bucket/", "/bucket/./")),
    "with an x/../ segment": spelled(lambda url, root: url.replace("/bucket/", "/bucket/x/../")),
    "with doubled slashes inside": spelled(lambda url, root: url.replace("/bucket/", "//bucket//")),
    "with a trailing /.": spelled(lambda url, root: url + "/."),
    "with the scheme in capitals (FILE://)": spelled(lambda url, root: "FILE" + url[len("file") :]),
    "with a localhost authority": spelled(lambda url, root: url.replace("file://", "file://localhost")),
    "through a symlinked alias of the bucket": spelled(
        lambda url, root: (os.symlink(root / "bucket", root / "alias"), url.replace("/bucket/", "/alias/"))[1]
    ),
    "with a percent-encoded slash (another name)": spelled(lambda url, root: url.replace("/bucket/ds", "/bucket%2Fds")),
    "with a Cyrillic s (another name)": spelled(lambda url, root: url[:-1] + "\u0455"),
}


@pytest.mark.parametrize("name", list(FOLLOWED))
def test_a_prefix_followed_in_two_spellings_yields_each_sample_once(name, published, tmp_path):
    url, _local = published
    root = tmp_path / "store"
    shutil.copytree(Path(url.removeprefix("file://")).parent.parent, root, symlinks=True)
    mine = f"file://{root}/bucket/ds"
    urls = FOLLOWED[name](mine, root)
    start = time.monotonic()
    seen = [row["sample_id"] for row in follow_dataset(urls, poll_s=0.05, idle_timeout_s=0.3, cache_dir=tmp_path / "cache")]
    assert sorted(seen) == [f"s{i:02d}" for i in range(8)], f"SILENT: followed as {sorted(seen)} (each sample once expected)"
    assert time.monotonic() - start < 20, "HANG"


def test_a_followed_prefix_rebuilt_under_its_dataset_id_with_other_bytes_is_refused(tmp_path):
    """The rebuild keeps the dataset id (a manifest edited, or a build resumed into a wiped prefix): only the shard hashes differ."""
    url = f"file://{tmp_path}/bucket/ds"
    store = tmp_path / "bucket" / "ds"
    first = build(tmp_path / "first", ids=("a0", "a1", "a2", "a3", "a4"))
    second = build(tmp_path / "second", ids=("b0", "b1", "b2", "b3", "b4"))
    publish_dataset(first, open_location(url))
    seen: list[str] = []

    def follow() -> None:
        for row in follow_dataset(url, poll_s=0.05, idle_timeout_s=1.0, cache_dir=tmp_path / "cache"):
            seen.append(row["sample_id"])
            if len(seen) == 5:
                dataset_id = load_manifest(store)["dataset_id"]
                shutil.rmtree(store)
                shutil.copytree(second, store)
                raw = load_manifest(store)
                raw["dataset_id"] = dataset_id
                save_manifest(store, raw)

    error = refused(follow, RebuiltDatasetError)
    assert seen == ["a0", "a1", "a2", "a3", "a4"], f"SILENT: {seen}"
    assert "now names other bytes than the shard already read" in one_line(error)


# ============================================================================ J. push to repo ids no Hub accepts
@pytest.mark.parametrize(
    "repo_id",
    [
        "us\u0435r/eagle3-data",  # a Cyrillic e
        "user/eagle3-data/",
        " user/eagle3-data",
        "user/eagle3-data\n",
        "user%2Feagle3-data",
        "https://huggingface.co/datasets/user/eagle3-data",
        "user/" + "d" * 97,
        "user/eagle3--data",
        "user/\ufb01le",  # the fi ligature
    ],
    ids=["homoglyph", "trailing-slash", "leading-space", "newline", "percent-slash", "url", "97-chars", "double-dash", "ligature"],
)
def test_push_to_a_repo_id_no_hub_accepts_is_exit_2_before_any_request(repo_id, base, capsys, monkeypatch):
    import huggingface_hub

    def no_network(*args, **kwargs):
        raise AssertionError("ESCAPE: the Hub was asked before the repo id was checked")

    monkeypatch.setattr(huggingface_hub, "HfApi", no_network)
    before = snapshot(base)
    rc, err = cli(["push", str(base), repo_id], capsys)
    assert rc == 2 and err.startswith("hs-dataset push: error: repo_id ") and "is not a Hub repository id" in err, (rc, err)
    assert snapshot(base) == before, "LOST: push changed the dataset"


# ============================================================================ K. local paths no file system holds
@pytest.mark.parametrize("entry", ["open_dataset", "verify_dataset"])
def test_a_dataset_path_with_a_nul_byte_is_a_usage_error(entry, ds):
    call = {"open_dataset": hs_dataset.open_dataset, "verify_dataset": verify_dataset}[entry]
    assert "holds a NUL byte" in one_line(refused(lambda: call(str(ds) + "\x00/../x"), UsageError))

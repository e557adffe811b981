"""Bounds that come from configuration, never from input size: hostile rows, templates, cards, model configs, server answers.

Every case feeds one hostile input to the real entry point and asserts a one-line
refusal (an ``HsDatasetError`` or an ``oversized`` row issue) naming the field and the
bound. Memory cases run the input in a child process and assert its peak RSS (the
child's own ``ru_maxrss``) under a stated bound; hang cases assert a time bound.
Assertion tags (tests/fixtures/tally.py): MEMORY: a memory bound broken, HANG: a time
bound broken, SILENT: wrong data accepted.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pydantic import ValidationError

from hs_dataset.config import LimitsSection, SGLangBackendSection, load_card
from hs_dataset.errors import HsDatasetError, ModelConfigError, ServerValidationError, SourceError
from hs_dataset.sources import SampleRules, load_samples
from tests.fixtures.assertions import one_line
from tests.fixtures.chat_rows import ASSISTANT_TAIL, GOOD, GOOD2
from tests.fixtures.child_memory import run_child

# stated bounds on what one hostile input may add to a child's resident memory (peak minus the RSS after its imports)
CHILD_GROWTH_MB = {"row": 300, "template": 200, "card": 50, "http": 64}


# ---------------------------------------------------------------- rows


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    from hs_dataset.demo.tiny_tokenizer import write_tiny_tokenizer

    directory = tmp_path_factory.mktemp("tok")
    write_tiny_tokenizer(directory)
    return AutoTokenizer.from_pretrained(directory)


def nested_dict(depth: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(depth):
        value = {"a": value}
    return value


def call_row(arguments) -> dict:
    return {
        "id": "bad",
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": arguments}}]},
        ],
    }


def many_turns(n: int) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": "x"} for i in range(n)]


def nested_list(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


DEEP_TEXT = "[" * 100_000 + "]" * 100_000
ROW_CASES = {
    "2000 messages": ({"id": "bad", "messages": many_turns(2000)}, {}, "messages: 2000 turns, over the 1024-turn bound"),
    "2000 sharegpt turns": (
        {"id": "bad", "conversations": [{"from": "human" if i % 2 == 0 else "gpt", "value": "x"} for i in range(2000)]},
        {},
        "conversations: 2000 turns",
    ),
    "2000 ultrachat strings": ({"id": "bad", "data": ["x"] * 2000}, {}, "data: 2000 turns"),
    "turns over a card bound of 3": (
        {"id": "bad", "messages": many_turns(4)},
        {"row_turns": 3},
        "over the 3-turn bound (raise limits.row_turns",
    ),
    "tool arguments 100 deep": (call_row(nested_dict(100)), {}, "over the row_depth bound"),
    "tool arguments 50000 deep": (call_row(nested_dict(50_000)), {}, "over the row_depth bound"),
    "argument JSON string 100000 deep": (call_row('{"a": ' * 100_000 + "1" + "}" * 100_000), {}, "arguments: JSON nested too deeply"),
    "argument JSON string 80 deep": (call_row('{"a": ' * 80 + "1" + "}" * 80), {}, "arguments: nested more than 64 levels"),
    "tools JSON string 100000 deep": ({**GOOD, "id": "bad", "tools": DEEP_TEXT}, {}, "tools: JSON nested too deeply"),
    "tools list 200 deep": ({**GOOD, "id": "bad", "tools": [nested_dict(200)]}, {}, "over the row_depth bound"),
    "sharegpt function_call 100000 deep": (
        {"id": "bad", "conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": DEEP_TEXT}]},
        {},
        "value: JSON nested too deeply",
    ),
    "assistant content 5000 deep": (
        {"id": "bad", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": nested_list(5000)}]},
        {},
        "over the row_depth bound",
    ),
    "extra column 5000 deep": ({**GOOD, "id": "bad", "meta": nested_list(5000)}, {}, "meta"),
    "depth over a card bound of 8": (call_row(nested_dict(6)), {"row_depth": 8}, "nested more than 8 levels"),
    "characters over a card bound": (
        {"id": "bad", "messages": [{"role": "user", "content": "x" * 5000}, {"role": "assistant", "content": "y"}]},
        {"row_chars": 4000},
        "more than 4000 characters of text, over the row_chars bound",
    ),
    "characters in keys": ({**GOOD, "id": "bad", "k" * 5000: 1}, {"row_chars": 4000}, "row_chars bound"),
    "characters in an extra column": ({**GOOD, "id": "bad", "note": "n" * 5000}, {"row_chars": 4000}, "note: the row has more than 4000"),
}


@pytest.mark.parametrize("name", list(ROW_CASES))
def test_row_over_a_bound_is_counted_and_skipped(tok, name):
    row, limits, reason = ROW_CASES[name]
    start = time.monotonic()
    samples, report = load_samples([GOOD, row, GOOD2], tok, SampleRules(max_length=1024, limits=LimitsSection(**limits)))
    elapsed = time.monotonic() - start
    assert [s.sample_id for s in samples] == ["good", "good2"], (
        f"SILENT: good rows lost or the bad row kept: {[s.sample_id for s in samples]}"
    )
    assert list(report.oversized) == [1], f"SILENT: the bad row is not counted oversized: {report.counts()} {report.issues}"
    assert reason in report.oversized[1] and "\n" not in report.oversized[1], report.oversized[1]
    assert elapsed < 10, f"HANG: {elapsed:.1f} s for one bad row"


@pytest.mark.parametrize("name", ["exactly 1024 turns", "64 levels of arguments"])
def test_row_at_a_bound_is_kept(tok, name):
    row = {"id": "ok", "messages": many_turns(1024)} if name == "exactly 1024 turns" else call_row(nested_dict(56))
    samples, report = load_samples([row], tok, SampleRules(max_length=64))
    assert len(samples) == 1 and not report.issues, f"SILENT: a row within the bounds was refused: {report.issues}"


def test_row_over_a_bound_in_strict_mode_is_one_line(tok):
    with pytest.raises(SourceError) as caught:
        load_samples([{"id": "bad", "messages": many_turns(2000)}], tok, SampleRules(strict=True))
    assert "row_turns" in one_line(caught.value)


def test_card_limits_reach_the_rules():
    card = load_card("tiny-deepseek-hf").with_overrides(limits={"row_turns": 7})
    assert card.limits.row_turns == 7 and card.limits.row_depth == 64
    with pytest.raises(HsDatasetError) as caught:
        card.with_overrides(limits={"row_depth": 100000})
    assert "limits.row_depth: must be <= 512" in str(caught.value).splitlines()[0]  # card errors add the docs hint below


def test_160k_turn_row_memory_is_bounded_in_a_child():
    code = f"""
import json, tempfile
from hs_dataset.demo.tiny_tokenizer import write_tiny_tokenizer
from hs_dataset.sources import SampleRules, load_samples
d = tempfile.mkdtemp(); write_tiny_tokenizer(d)
row = {{"id": "bad", "messages": [{{"role": "user" if i % 2 == 0 else "assistant", "content": "hello"}} for i in range(160_000)]}}
path = d + "/rows.jsonl"; open(path, "w").write(json.dumps(row) + "\\n" + json.dumps({GOOD!r}) + "\\n")
load_samples([{GOOD!r}], d, SampleRules(max_length=1024)); del row
BASE = _rss('VmRSS:')
samples, report = load_samples(path, d, SampleRules(max_length=1024))
RESULT = {{"samples": len(samples), "oversized": report.oversized}}
"""
    result, _elapsed = run_child(code)
    assert result["samples"] == 1 and "row_turns" in result["oversized"]["0"]
    assert result["growth_mb"] < CHILD_GROWTH_MB["row"], (
        f"MEMORY: +{result['growth_mb']:.0f} MB for a 160k-turn row (bound {CHILD_GROWTH_MB['row']} MB)"
    )


# ---------------------------------------------------------------- chat templates

TEMPLATE_CASES = {
    "nested loops for ever": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "template_seconds"),
    "loop over a loop with a namespace": (
        "{% set ns = namespace(n=0) %}{% for i in range(100000) %}{% for j in range(100000) %}{% set ns.n = ns.n + 1 %}{% endfor %}{% endfor %}",
        "template_seconds",
    ),
    "10 GB string by repetition": ("{{ 'x' * 10000000000 }}", "a repeated value"),
    "10 GB string from data": ("{{ messages[0].content * 10000000000 }}", "a repeated value"),
    "list repetition": ("{% set l = [1] * 1000000000 %}", "a repeated value"),
    "output by loops": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' }}{% endfor %}{% endfor %}",
        "an output",
    ),
    "percent format width": ("{{ '%999999999s' % 'a' }}", "a formatted string"),
    "format method width": ("{{ '{:>999999999}'.format('a') }}", "a formatted string"),
    "center filter": ("{{ 'a' | center(1000000000) }}", "a width or count"),
    "indent filter": ("{{ 'a\nb' | indent(1000000000) }}", "a width or count"),
    "ljust method": ("{{ 'a'.ljust(1000000000) }}", "a width or count"),
    "huge power": ("{{ 7 ** 1000000000 }}", "a power"),
    "concatenation of lists": ("{% set a = [0] * 10000000 %}{% set b = a + a %}", "a joined value"),
}


def template_rules(template: str, seconds: float = 1.0) -> SampleRules:
    return SampleRules(chat_template=template + ASSISTANT_TAIL, limits=LimitsSection(template_seconds=seconds))


@pytest.mark.parametrize("name", list(TEMPLATE_CASES))
def test_hostile_template_is_an_oversized_row(tok, name):
    template, reason = TEMPLATE_CASES[name]
    start = time.monotonic()
    samples, report = load_samples([GOOD], tok, template_rules(template))
    elapsed = time.monotonic() - start
    assert elapsed < 6, f"HANG: the template ran {elapsed:.1f} s (bound 1 s)"
    assert not samples and list(report.oversized) == [0], f"SILENT: {report.counts()} {report.issues}"
    assert reason in report.oversized[0] and "\n" not in report.oversized[0], report.oversized[0]


def test_template_bounds_come_from_the_card(tok):
    template = "{% for i in range(3000) %}{{ 'x' }}{% endfor %}"
    samples, _ = load_samples([GOOD], tok, SampleRules(chat_template=template + ASSISTANT_TAIL))
    assert len(samples) == 1
    samples, report = load_samples(
        [GOOD], tok, SampleRules(chat_template=template + ASSISTANT_TAIL, limits=LimitsSection(template_chars=2048))
    )
    assert not samples and "2048-character template_chars bound" in report.oversized[0]


def test_ordinary_template_renders_as_transformers_does(tok):
    from transformers.utils import chat_template_utils as utils

    from hs_dataset.sources.chat import ChatTokenizer
    from hs_dataset.sources.masking import resolve_mask_rule

    chat = ChatTokenizer(tok, resolve_mask_rule(tok))
    conv_messages = [
        {"role": "system", "content": "s"},
        *GOOD["messages"],
        {"role": "user", "content": "more {{ x }} %s"},
        {"role": "assistant", "content": "ok"},
    ]
    ours = chat.apply(conv_messages, None)
    plain = utils._cached_compile_jinja_template(tok.get_chat_template()).render(
        messages=conv_messages, tools=None, documents=None, add_generation_prompt=False
    )
    theirs = tok(plain, add_special_tokens=False)["input_ids"]
    assert list(ours["input_ids"]) == list(theirs), "SILENT: the bounded template renders differently"


def test_hostile_template_memory_is_bounded_in_a_child():
    code = f"""
import tempfile
from hs_dataset.demo.tiny_tokenizer import write_tiny_tokenizer
from hs_dataset.sources import SampleRules, load_samples
from hs_dataset.config import LimitsSection
d = tempfile.mkdtemp(); write_tiny_tokenizer(d)
tail = {ASSISTANT_TAIL!r}
bombs = ["{{{{ 'x' * 10000000000 }}}}", "{{% for i in range(100000) %}}{{% for j in range(100000) %}}xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx{{% endfor %}}{{% endfor %}}",
         "{{{{ 'a' | center(10000000000) }}}}"]
load_samples([{GOOD!r}], d, SampleRules())
BASE = _rss('VmRSS:')
found = []
for bomb in bombs:
    samples, report = load_samples([{GOOD!r}], d, SampleRules(chat_template=bomb + tail, limits=LimitsSection(template_seconds=2)))
    found.append(report.oversized.get(0, ""))
RESULT = {{"oversized": found}}
"""
    result, _elapsed = run_child(code)
    assert all("template_chars" in r for r in result["oversized"]), result
    assert result["growth_mb"] < CHILD_GROWTH_MB["template"], (
        f"MEMORY: +{result['growth_mb']:.0f} MB for template bombs (bound {CHILD_GROWTH_MB['template']} MB)"
    )


# ---------------------------------------------------------------- cards


def laughs(levels: int = 9) -> str:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels + 1):
        ref = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([ref] * 10)}]")
    return "name: x\n" + "\n".join(lines) + "\n"


CARD_CASES = {
    "billion laughs": (laughs(), "more than 64 aliases"),
    "65 aliases": ("name: &n x\nl: [" + ", ".join(["*n"] * 65) + "]\n", "more than 64 aliases"),
    "flow lists 100000 deep": ("name: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested more than 32 levels"),
    "block mappings 40 deep": ("".join("  " * i + f"k{i}:\n" for i in range(40)) + "  " * 40 + "v: 1\n", "nested more than 32 levels"),
    "not UTF-8": (b"name: \xff\xfe\n", "not UTF-8 text"),
    "over 1 MiB": ("name: x\n" + "# pad\n" * 200_000, "over 1048576 bytes"),
    "not YAML": ("name: [unclosed\n  - x: {\n", "not valid YAML"),
}


@pytest.mark.parametrize("name", list(CARD_CASES))
def test_hostile_card_is_one_line_naming_the_file(tmp_path, name):
    text, reason = CARD_CASES[name]
    path = tmp_path / "hostile.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(HsDatasetError) as caught:
        load_card(path)
    message = one_line(caught.value)
    assert str(path) in message and reason in message, message


def test_card_that_is_a_directory(tmp_path):
    (tmp_path / "dir.yaml").mkdir()
    with pytest.raises(HsDatasetError) as caught:
        load_card(tmp_path / "dir.yaml")
    assert "cannot read the card" in one_line(caught.value)


def test_billion_laughs_memory_is_bounded_in_a_child(tmp_path):
    path = tmp_path / "laughs.yaml"
    path.write_text(laughs(12))
    code = f"""
from hs_dataset.config import load_card
from hs_dataset.errors import HsDatasetError
BASE = _rss('VmRSS:')
try:
    load_card({str(path)!r}); RESULT = {{"error": ""}}
except HsDatasetError as exc:
    RESULT = {{"error": str(exc)}}
"""
    result, elapsed = run_child(code)
    assert "aliases" in result["error"], result
    assert result["growth_mb"] < CHILD_GROWTH_MB["card"], (
        f"MEMORY: +{result['growth_mb']:.0f} MB for a billion-laughs card (bound {CHILD_GROWTH_MB['card']} MB)"
    )
    assert elapsed < 30, f"HANG: {elapsed:.1f} s"


# ---------------------------------------------------------------- model config.json

GOOD_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 6,
    "hidden_size": 64,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
}
CONFIG_CASES = {
    "truncated JSON": ('{"num_hidden_layers": 6, "hidden_si', "not valid JSON"),
    "hidden_size -64": ({**GOOD_CONFIG, "hidden_size": -64}, "hidden_size is -64, outside [1, 131072]"),
    "hidden_size 10**12": ({**GOOD_CONFIG, "hidden_size": 10**12}, "hidden_size is 1000000000000, outside"),
    "num_hidden_layers six": ({**GOOD_CONFIG, "num_hidden_layers": "six"}, "num_hidden_layers must be an integer in [1, 1024], got str"),
    "num_hidden_layers 1e9": ({**GOOD_CONFIG, "num_hidden_layers": 1_000_000_000}, "num_hidden_layers is 1000000000, outside [1, 1024]"),
    "num_hidden_layers 6.0": ({**GOOD_CONFIG, "num_hidden_layers": 6.0}, "num_hidden_layers must be an integer"),
    "num_hidden_layers true": ({**GOOD_CONFIG, "num_hidden_layers": True}, "got bool"),
    "num_hidden_layers missing": ({k: v for k, v in GOOD_CONFIG.items() if k != "num_hidden_layers"}, "num_hidden_layers is missing"),
    "vocab_size 0": ({**GOOD_CONFIG, "vocab_size": 0}, "vocab_size is 0"),
    "max_position_embeddings string": ({**GOOD_CONFIG, "max_position_embeddings": "4k"}, "max_position_embeddings must be an integer"),
    "wrapper text_config layers 1e9": (
        {"architectures": ["X"], "text_config": {**GOOD_CONFIG, "num_hidden_layers": 10**9}},
        "num_hidden_layers is 1000000000",
    ),
    "a JSON list": ("[1, 2]", "must hold a JSON object"),
    "not UTF-8": (b'{"hidden_size": "\xff"}', "not UTF-8 JSON"),
    "nested 100000 deep": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "over 4 MiB": ('{"pad": "' + "x" * (5 << 20) + '"}', "over 4194304 bytes"),
}


def write_config(directory: Path, config) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    data = config if isinstance(config, bytes) else (config if isinstance(config, str) else json.dumps(config)).encode()
    (directory / "config.json").write_bytes(data)
    return directory


@pytest.mark.parametrize("name", list(CONFIG_CASES))
def test_hostile_model_config_is_one_line_naming_file_and_field(tmp_path, name):
    from hs_dataset.model.card_from_model import model_card_dict

    config, reason = CONFIG_CASES[name]
    directory = write_config(tmp_path / "model", config)
    with pytest.raises(ModelConfigError) as caught:
        model_card_dict(str(directory))
    message = one_line(caught.value)
    assert str(directory / "config.json") in message and reason in message, message


def test_config_symlink_to_an_unreadable_file(tmp_path):
    from hs_dataset.model.model_config import read_model_config

    target = tmp_path / "secret.json"
    target.write_text(json.dumps(GOOD_CONFIG))
    target.chmod(0)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").symlink_to(target)
    try:
        if os.access(target, os.R_OK):
            pytest.skip("running as a user who reads any file (root)")
        with pytest.raises(ModelConfigError) as caught:
            read_model_config(tmp_path / "model")
        assert "cannot read the model config" in one_line(caught.value)
    finally:
        target.chmod(0o644)


def test_card_init_refuses_a_billion_layers_in_one_line(tmp_path, capsys):
    from hs_dataset.cli.main import main

    directory = write_config(tmp_path / "model", {**GOOD_CONFIG, "num_hidden_layers": 1_000_000_000})
    rc = main(["card", "init", "--model", str(directory)])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and "num_hidden_layers is 1000000000" in err and "internal error" not in err, err
    assert len(err.splitlines()) == 1, err


def test_aux_layers_outside_the_model_are_a_card_error(tmp_path):
    from hs_dataset.capture.base import CaptureTarget
    from hs_dataset.capture.hf import HFBackend
    from hs_dataset.config import HFBackendSection

    directory = write_config(tmp_path / "model", GOOD_CONFIG)
    with pytest.raises(HsDatasetError) as caught:
        HFBackend(HFBackendSection(name="hf"), CaptureTarget(model_path=str(directory), aux_layer_ids=(2, 99)))
    message = one_line(caught.value)
    assert "layers.aux" in message and "[99]" in message and "6-layer" in message, message


# ---------------------------------------------------------------- HTTP answers

BODIES: dict[str, tuple[int, str, bytes | None]] = {  # path -> (status, content type, body; None: endless)
    "/endless": (200, "application/json", None),
    "/huge": (200, "application/json", b"[" + b"1," * (9 << 20) + b"1]"),
    "/garbage": (200, "application/json", bytes(range(256)) * 64),
    "/html": (200, "text/html", b"<html>hello</html>"),
    "/nonutf8": (200, "application/json", b'{"model_path": "\xff\xfe"}'),
    "/deep": (200, "application/json", b"[" * 200_000 + b"]" * 200_000),
    "/error500": (500, "text/plain", b"x" * (4 << 20)),
    "/info-version-int/server_info": (200, "application/json", json.dumps({"version": 5, "model_path": "m"}).encode()),
    "/info-hooks-dict/server_info": (
        200,
        "application/json",
        json.dumps({"version": "0.5", "model_path": "m", "forward_hooks": {"a": 1}}).encode(),
    ),
    "/info-radix-str/server_info": (200, "application/json", json.dumps({"version": "0.5", "disable_radix_cache": "yes"}).encode()),
    "/info-list/server_info": (200, "application/json", b"[1, 2, 3]"),
}
GENERATE_ANSWERS = {
    "string token ids": ({"output_ids": ["7", "8"]}, "output_ids[0] is a str"),
    "float token ids": ({"output_ids": [7.0]}, "output_ids[0] is a float"),
    "bool token ids": ({"output_ids": [True]}, "output_ids[0] is a bool"),
    "id outside the vocabulary": ({"output_ids": [5, 1000]}, "output_ids[1] = 1000 is outside the vocabulary [0, 1000)"),
    "negative id": ({"output_ids": [-1]}, "output_ids[0] = -1 is outside"),
    "id over int64": ({"output_ids": [2**70]}, "is outside the vocabulary"),
    "output_ids a string": ({"output_ids": "1 2 3"}, "output_ids is a str"),
    "answer a list": ([1, 2], "a JSON list, not an object"),
}


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep the test output clean
        pass

    def _answer(self):
        path = self.path
        if path.startswith("/gen-"):
            name = list(GENERATE_ANSWERS)[int(path[len("/gen-") :].split("/")[0])]
            status, ctype, body = 200, "application/json", json.dumps(GENERATE_ANSWERS[name][0]).encode()
        else:
            status, ctype, body = BODIES[path]
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        if body is None:
            self.end_headers()
            try:
                chunk = b"[" * 65536
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    self.wfile.write(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass
            return
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    do_GET = _answer

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self._answer()


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def fetch(url: str, max_bytes: int = 1 << 20):
    from hs_dataset.capture.sglang.http import get_json, new_session

    async def go():
        async with new_session(1, 30) as session:
            return await get_json(session, url, 30, max_bytes)

    return asyncio.run(go())


HTTP_CASES = {
    "endless body": ("/endless", "over 1048576 bytes"),
    "announced huge body": ("/huge", "over 1048576 bytes"),
    "garbage bytes": ("/garbage", "not UTF-8"),
    "HTML page": ("/html", "content type 'text/html', not JSON"),
    "non-UTF-8 JSON": ("/nonutf8", "not UTF-8"),
    "JSON 200000 deep": ("/deep", "nested too deeply"),
}


@pytest.mark.parametrize("name", list(HTTP_CASES))
def test_hostile_answer_is_one_line(server, name):
    from hs_dataset.capture.sglang.http import BadResponseError

    path, reason = HTTP_CASES[name]
    start = time.monotonic()
    with pytest.raises(BadResponseError) as caught:
        fetch(server + path)
    assert time.monotonic() - start < 10, "HANG: the answer was read past its bound"
    message = one_line(caught.value)
    assert path in message and reason in message, message


def test_error_status_reads_only_the_start(server):
    from hs_dataset.capture.sglang.http import HTTPStatusError

    with pytest.raises(HTTPStatusError) as caught:
        fetch(server + "/error500")
    assert caught.value.status == 500 and len(caught.value.text) <= 64 * 1024, "MEMORY: a 4 MB error body was read whole"


@pytest.mark.parametrize("name", ["info-version-int", "info-hooks-dict", "info-radix-str", "info-list"])
def test_hostile_server_info_is_a_validation_error(server, name):
    from hs_dataset.capture.sglang.http import new_session
    from hs_dataset.capture.sglang.validate import read_server_info

    async def go():
        async with new_session(1, 30) as session:
            info = await read_server_info(f"{server}/{name}", session, 1 << 20)
            if name == "info-hooks-dict":
                from hs_dataset.capture.sglang.validate import capture_hook_config

                capture_hook_config(server, info)

    with pytest.raises(ServerValidationError) as caught:
        asyncio.run(go())
    assert name in one_line(caught.value) or "forward_hooks" in str(caught.value)


@pytest.mark.parametrize("name", list(GENERATE_ANSWERS))
def test_hostile_generate_answer_is_a_failed_turn(server, name):
    from hs_dataset.capture.sglang.generate import SGLangGenerator
    from hs_dataset.regenerate.generator import GenerationParams

    url = f"{server}/gen-{list(GENERATE_ANSWERS).index(name)}"
    generator = SGLangGenerator([url], retries=0, vocab_size=1000, request_timeout_s=10)
    try:
        (result,) = generator.generate([[1, 2, 3]], GenerationParams(max_new_tokens=4))
    finally:
        generator.close()
    reason = GENERATE_ANSWERS[name][1]
    assert result.finish == "failed" and not result.token_ids, f"SILENT: {result}"
    assert reason in result.error and "\n" not in result.error, result.error


def test_max_response_bytes_is_a_card_field():
    section = SGLangBackendSection(name="sglang")
    assert section.max_response_bytes == 16 * 1024 * 1024
    with pytest.raises(ValidationError, match="greater than or equal to 4096"):
        SGLangBackendSection(name="sglang", max_response_bytes=10)


def test_endless_answer_memory_is_bounded_in_a_child(server):
    code = f"""
import asyncio
from hs_dataset.capture.sglang.http import get_json, new_session, BadResponseError
import aiohttp
BASE = _rss('VmRSS:')
async def go():
    async with new_session(1, 60) as session:
        return await get_json(session, {server + "/endless"!r}, 60)
try:
    asyncio.run(go()); RESULT = {{"error": ""}}
except BadResponseError as exc:
    RESULT = {{"error": str(exc)}}
"""
    result, elapsed = run_child(code)
    assert "over 16777216 bytes" in result["error"], result
    assert result["growth_mb"] < CHILD_GROWTH_MB["http"], (
        f"MEMORY: +{result['growth_mb']:.0f} MB for an endless answer (bound {CHILD_GROWTH_MB['http']} MB)"
    )
    assert elapsed < 30, f"HANG: {elapsed:.1f} s"

"""Untrusted input: chat templates bounded by what the sample can use, during rendering and per row.

Cases: an output far longer than ``max_length`` can need (refused before it is tokenized),
templates that build gigabytes inside the bounds (``~`` doubling, ``join``, a ``replace``
chain, values kept in variables), a row of many turns near ``template_seconds`` (the bound
is the row's, across its renders), a template that fails every row (the build stops,
naming it) and the ``limits`` section's upper bounds. Memory is measured in a child
process (MEMORY:), time against a stated bound (HANG:).
"""

from __future__ import annotations

import json
import time

import pytest
import torch

from hs_dataset.config import LimitsSection
from hs_dataset.errors import HsDatasetError, SourceError
from hs_dataset.sources import SampleRules, load_samples
from tests.fixtures.assertions import one_line
from tests.fixtures.chat_rows import ASSISTANT_TAIL, GOOD
from tests.fixtures.child_memory import run_child

CHILD_GROWTH_MB = 300  # the bound on what one hostile input may add to a process

AMPLIFIERS = {  # each builds gigabytes from a few kilobytes, inside the one-operation bound; the words of the refusal
    "16M characters of output": ("{% for i in range(16000) %}{{ 'x' * 1000 }}{% endfor %}", "an output of over 262144"),
    "~ doubling": (
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
        "a joined value (~)",
    ),
    "join of a repeated string": ("{% set l = ['x' * 1000000] * 1000 %}{{ l | join }}", "join filter"),
    "str.join of a repeated string": ("{% set l = ['x' * 1000000] * 1000 %}{{ ''.join(l) }}", "join()"),
    "replace chain (method)": ("{% set s = 'x' * 1000000 %}{{ s.replace('x', 'xxxxxxxxxx').replace('x', 'xxxxxxxxxx') }}", "replace()"),
    "replace chain (filter)": (
        "{% set s = 'x' * 100000 %}{{ s | replace('x', 'xxxxxxxxxx') | replace('x', 'xxxxxxxxxx') | replace('x', 'xxxxxxxxxx') }}",
        "replace filter",
    ),
    "tojson of a repeated string": ("{% set l = ['x' * 1000000] * 1000 %}{{ l | tojson }}", "tojson filter"),
    "a list written out": ("{% set l = ['x' * 1000000] * 1000 %}{{ l }}", "an output of over"),
    "a list formatted with %": ("{% set l = ['x' * 1000000] * 1000 %}{{ '%s' % (l,) }}", "a formatted string"),
    "indent of a million lines": ("{% set s = 'x\n' * 8000000 %}{{ s | indent(100) }}", "indent filter"),
    "lipsum": ("{{ lipsum(100000) }}", "generate_lorem_ipsum()"),
    "slices kept in variables": (
        "{% set a = 'x' * 16000000 %}{% set b = a[1:] %}{% set c = a[2:] %}{% set d = a[3:] %}",
        "MiB of strings and lists in all",
    ),
    "lists kept in variables": (
        "{% set a = [0] * 16000000 %}{% set b = [1] * 16000000 %}{% set c = [2] * 16000000 %}",
        "MiB of strings and lists in all",
    ),
}


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    from hs_dataset.demo.tiny_tokenizer import write_tiny_tokenizer

    directory = tmp_path_factory.mktemp("tok")
    write_tiny_tokenizer(directory)
    return AutoTokenizer.from_pretrained(directory)


@pytest.mark.parametrize("name", list(AMPLIFIERS))
def test_amplifying_template_is_refused_before_it_builds(tok, name):
    template, words = AMPLIFIERS[name]
    start = time.monotonic()
    samples, report = load_samples([GOOD], tok, SampleRules(chat_template=template + ASSISTANT_TAIL, max_length=4096))
    elapsed = time.monotonic() - start
    assert elapsed < 5, f"HANG: {elapsed:.1f} s for one row (16M characters of output took 34 s)"
    assert not samples and list(report.oversized) == [0], f"SILENT: {report.counts()} {report.issues}"
    assert words in report.oversized[0] and "\n" not in report.oversized[0], report.oversized[0]


def test_amplifying_templates_memory_is_bounded_in_a_child():
    """Measured on the issue's own cases: ~ doubling 5.3 GB, 16M characters 4.3 GB, join +1.5 GB, replace +1.1 GB."""
    bombs = [template for template, _ in AMPLIFIERS.values()]
    code = f"""
import tempfile
from hs_dataset.demo.tiny_tokenizer import write_tiny_tokenizer
from hs_dataset.sources import SampleRules, load_samples
d = tempfile.mkdtemp(); write_tiny_tokenizer(d)
load_samples([{GOOD!r}], d, SampleRules())
BASE = _rss('VmRSS:')
found = []
for bomb in {bombs!r}:
    samples, report = load_samples([{GOOD!r}], d, SampleRules(chat_template=bomb + {ASSISTANT_TAIL!r}))
    found.append(report.oversized.get(0, ""))
RESULT = {{"oversized": found}}
"""
    result, _elapsed = run_child(code, timeout=180)
    assert all(result["oversized"]), f"SILENT: {result['oversized']}"
    assert result["growth_mb"] < CHILD_GROWTH_MB, (
        f"MEMORY: +{result['growth_mb']:.0f} MB for the amplifying templates (bound {CHILD_GROWTH_MB} MB)"
    )


def test_output_bound_follows_max_length_and_ordinary_rows_pass(tok):
    from hs_dataset.sources.char_cap import output_char_cap

    template = "{% for i in range(300) %}{{ 'y' * 1000 }}{% endfor %}"  # 300,000 characters
    rules = SampleRules(chat_template=ASSISTANT_TAIL + template, max_length=4096)
    assert output_char_cap(4096) < 300_000 < output_char_cap(8192)
    assert not load_samples([GOOD], tok, rules)[0]
    samples, report = load_samples([GOOD], tok, SampleRules(chat_template=ASSISTANT_TAIL + template, max_length=8192))
    assert len(samples) == 1 and samples[0].truncated and samples[0].meta["full_length"] > 8192, f"LOST: {report.issues}"


# ---------------------------------------------------------------------------- time: the row's, across its renders

SLOW = "{% for i in range(4) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"  # a render of a few tenths of a second


class Echo:
    """A generator that answers every prompt with the same two tokens and a stop (no model needed)."""

    def __init__(self, stop: int) -> None:
        self.stop, self.calls = stop, 0

    def generate(self, prompts, params):
        from hs_dataset.regenerate.generator import GenerationResult

        self.calls += 1
        return [GenerationResult([40, 41, self.stop], "stop") for _ in prompts]

    def describe(self):
        return {"engine": "echo"}


def test_row_time_budget_runs_across_the_turns_of_a_regenerated_row(tmp_path, tiny_card, tiny_model_dir):
    """A 40-turn row near template_seconds took 96 s: the bound was per render (two renders per turn)."""
    from transformers import AutoTokenizer

    from hs_dataset.regenerate.engine import Regeneration
    from hs_dataset.sample import TokenizedSample
    from hs_dataset.sources.messages import Conversation

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = SLOW + tokenizer.chat_template
    turns = [m for i in range(40) for m in ({"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"})]
    ids = torch.arange(5, 15)
    sample = TokenizedSample("long", ids, torch.ones(10, dtype=torch.bool), meta={"conversation": Conversation(turns, None)})
    # 0.5 s: all of the row's renders take ~1.5 s on this machine, so a 2 s budget would not bind
    card = tiny_card.with_overrides(limits={"template_seconds": 0.5}, regenerate={"enabled": True, "concurrency": 1})
    regen = Regeneration(card, Echo(tokenizer.eos_token_id), tokenizer, tmp_path, "regenerated.jsonl")
    start = time.monotonic()
    list(regen.regenerate([sample]))
    elapsed = time.monotonic() - start
    record = regen.store.get("long")
    assert elapsed < 8, f"HANG: the row's renders took {elapsed:.1f} s in all (template_seconds 0.5)"
    failed = [t for t in record["turns"] if t.get("error")]
    assert failed and "template_seconds" in failed[-1]["error"] and "renders" in failed[-1]["error"], record["turns"][-1]
    assert 1 < len(record["turns"]) < 40, f"the budget stopped the row after {len(record['turns'])} turns"


# ---------------------------------------------------------------------------- a template that fails every row

LOOPING = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


def test_build_stops_naming_the_template_when_every_row_fails_the_same_way(tmp_path, tiny_card, hf_backend):
    """A looping template stopped at 5 s a row, but 42 rows took 3.6 min and wrote nothing."""
    from hs_dataset.pipeline.build import build_dataset

    template = tmp_path / "looping.jinja"
    template.write_text(LOOPING + ASSISTANT_TAIL)
    card = tiny_card.with_overrides(model={"chat_template": str(template)}, limits={"template_seconds": 0.3})
    start = time.monotonic()
    with pytest.raises(SourceError) as caught:
        build_dataset(card, tmp_path / "ds", backend=hf_backend)
    elapsed = time.monotonic() - start
    message = one_line(caught.value)
    assert f"the chat template {template} (model.chat_template) failed on the first 8 rows the same way" in message, message
    assert "template_seconds" in message and "limits.template_failures" in message, message
    assert elapsed < 8 * 0.3 + 20, f"HANG: {elapsed:.1f} s before the build stopped"


def test_build_goes_on_when_some_rows_render(tmp_path, tiny_card, hf_backend):
    """Rows the template refuses before any row rendered do not stop a build whose later rows render."""
    from hs_dataset.pipeline.build import build_dataset

    refuse = "{% if messages[0].content.startswith('BAD') %}{{ raise_exception('no') }}{% endif %}"
    rows = [
        {"id": f"bad{i}", "messages": [{"role": "user", "content": f"BAD {i}"}, {"role": "assistant", "content": "x"}]} for i in range(3)
    ]
    rows += [
        {"id": f"good{i}", "messages": [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": "yes"}]} for i in range(3)
    ]
    rows += [
        {"id": f"late{i}", "messages": [{"role": "user", "content": f"BAD {i}"}, {"role": "assistant", "content": "x"}]} for i in range(9)
    ]
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    template = tmp_path / "refusing.jinja"
    template.write_text(refuse + ASSISTANT_TAIL)
    card = tiny_card.with_overrides(model={"chat_template": str(template)}, limits={"template_failures": 4})
    report = build_dataset(card, tmp_path / "ds", backend=hf_backend, source=str(source))
    assert report.samples_written == 3 and report.not_written() == {"malformed": 12}, f"LOST: {report.not_written()}"


# ---------------------------------------------------------------------------- every limit has an upper bound


def test_every_limit_has_an_upper_bound():
    from annotated_types import Le, Lt

    for name, info in LimitsSection.model_fields.items():
        assert any(isinstance(m, (Le, Lt)) for m in info.metadata), f"limits.{name} has no upper bound"
    for name, value in {
        "row_turns": 10**7,
        "row_chars": 1 << 40,
        "row_depth": 10**4,
        "template_chars": 1 << 40,
        "template_seconds": 1e9,
        "template_failures": 10**9,
    }.items():
        with pytest.raises(Exception) as caught:
            LimitsSection(**{name: value})
        assert name in str(caught.value), caught.value
    with pytest.raises(HsDatasetError) as caught:
        from hs_dataset.config import card_from_dict, load_card

        card_from_dict({**load_card("tiny-deepseek-hf").model_dump(mode="json"), "limits": {"template_chars": 1 << 40}}, where="card")
    assert "limits.template_chars: must be <= 268435456" in str(caught.value), caught.value

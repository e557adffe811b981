"""Cross-check our Kimi-K2.5 loss masks against SpecForge 0.2.0's own Kimi template handling.

SpecForge (installed by ``make interop-env``) registers ``kimi-k2-thinking``: the
mask is every character matched by ``<|im_assistant|>assistant<|im_middle|>(.*?<|im_end|>)``,
mapped to tokens by re-encoding prefixes. Two comparisons on the 42 bundled
conversations: (1) on our rendered text (SpecForge's ``preformatted`` path), which
isolates the masking rule; (2) SpecForge rendering the messages itself, which also
compares message handling. docs/SOURCES.md explains every difference.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("specforge")


@pytest.fixture(scope="module")
def pairs(tiny_model_dir):
    from transformers import AutoTokenizer

    from hs_dataset.sources import SampleRules, bundled_conversations_path, iter_samples

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir), local_files_only=True)
    rows = [json.loads(line) for line in open(bundled_conversations_path(), encoding="utf-8") if line.strip()]
    ours = {s.sample_id: s for s in iter_samples(bundled_conversations_path(), tok, SampleRules(max_length=100_000))}
    return tok, rows, ours


def _specforge_parser(tok):
    from specforge.data.parse import ThinkingParser
    from specforge.data.template import TEMPLATE_REGISTRY

    return ThinkingParser(tok, TEMPLATE_REGISTRY.get("kimi-k2-thinking"))


def test_masking_rule_agrees_on_our_rendering(pairs):
    tok, rows, ours = pairs
    parser = _specforge_parser(tok)
    same = 0
    for row in rows:
        sample = ours[row["id"]]
        text = tok.decode(sample.input_ids.tolist())
        ids, mask = parser.parse(text, max_length=100_000, preformatted=True)
        assert torch.equal(ids, sample.input_ids), row["id"]
        same += bool(torch.equal(mask.bool(), sample.loss_mask))
    print(f"SpecForge kimi-k2-thinking on our rendering: {same} of {len(rows)} conversations identical masks")
    assert same == len(rows)


def test_specforge_rendering_differences_are_the_documented_ones(pairs):
    tok, rows, ours = pairs
    parser = _specforge_parser(tok)
    same_ids = same_masks = 0
    for row in rows:
        tools = row.get("tools")
        tools = json.loads(tools) if isinstance(tools, str) else tools
        try:
            ids, mask = parser.parse(row["messages"], max_length=100_000, tool=tools or [])
        except Exception:  # noqa: BLE001 -- SpecForge refusing a row counts as a difference
            continue
        sample = ours[row["id"]]
        if torch.equal(ids, sample.input_ids):
            same_ids += 1
            same_masks += bool(torch.equal(mask.bool(), sample.loss_mask))
    print(f"SpecForge rendering the messages itself: {same_ids} of {len(rows)} identical tokens, {same_masks} identical masks")
    assert same_masks == same_ids  # wherever the tokens agree, the masks agree

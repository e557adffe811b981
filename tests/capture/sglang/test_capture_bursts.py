"""Capture beside regeneration: finished conversations go to the servers in groups that fill one prefill batch.

On the H200 (docs/BENCHMARKS.md, 2026-12-02) regeneration alone kept 0.97 of a continuous
client's rate, but only 0.72 with capture sent a sample at a time as conversations
finished: each capture request was a prefill batch of its own, pausing every decoding
request. ``sample.bursts`` holds finished samples back until they fill a batch
(``capacity.prefill_tokens``: the servers' ``chunked_prefill_size``) or capture's in-flight count.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

from hs_dataset.capture.sglang.capacity import DEFAULT_PREFILL_TOKENS, prefill_tokens
from hs_dataset.sample import TokenizedSample, bursts


def sample(i: int, n: int) -> TokenizedSample:
    return TokenizedSample(sample_id=f"s{i}", input_ids=torch.zeros(n, dtype=torch.int64), loss_mask=torch.ones(n, dtype=torch.bool))


def test_samples_are_held_until_they_fill_a_prefill_batch():
    produced: list[int] = []

    def finished():
        for i, n in enumerate([3000, 3000, 3000, 500, 9000, 10]):
            produced.append(i)
            yield sample(i, n)

    # (sample, how many the producer had made when it was let go)
    seen = [(s.sample_id, len(produced)) for s in bursts(finished(), 8192, 32)]
    assert seen == [("s0", 3), ("s1", 3), ("s2", 3), ("s3", 5), ("s4", 5), ("s5", 6)]  # the rest goes at the end


def test_a_group_never_outgrows_what_capture_keeps_in_flight():
    groups, produced = [], []

    def finished():
        for i in range(10):
            produced.append(i)
            yield sample(i, 1)

    for _group in bursts(finished(), 10_000, 4):
        groups.append(len(produced))
    assert groups == [4] * 4 + [8] * 4 + [10] * 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 5000), max_size=40), st.integers(1, 20000), st.integers(1, 40))
def test_every_sample_comes_out_once_in_order(lengths, tokens, size):
    out = [s.sample_id for s in bursts((sample(i, n) for i, n in enumerate(lengths)), tokens, size)]
    assert out == [f"s{i}" for i in range(len(lengths))]


def test_a_consumer_that_stops_closes_the_producer_at_once():
    closed = []

    def finished():
        try:
            for i in range(100):
                yield sample(i, 1)
        finally:
            closed.append(True)

    grouped = bursts(finished(), 1, 1)
    next(grouped)
    grouped.close()
    assert closed == [True]


def test_the_batch_is_the_smallest_chunked_prefill_the_servers_report():
    assert prefill_tokens([{"chunked_prefill_size": 16384}, {"chunked_prefill_size": 8192}]) == 8192
    assert prefill_tokens([{"chunked_prefill_size": -1}]) == DEFAULT_PREFILL_TOKENS  # chunking off: no batch size reported
    assert prefill_tokens([{}, {"chunked_prefill_size": 64}]) == 64
    assert prefill_tokens([{"chunked_prefill_size": "x"}, {"chunked_prefill_size": True}]) == DEFAULT_PREFILL_TOKENS
    assert prefill_tokens([]) == DEFAULT_PREFILL_TOKENS

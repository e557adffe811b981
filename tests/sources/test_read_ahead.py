"""The tokenization read-ahead keeps the source's order, its errors and its bound."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

from hs_dataset.sources.read_ahead import read_ahead


@settings(max_examples=40, deadline=None)
@given(items=st.lists(st.integers()), depth=st.integers(min_value=-1, max_value=8))
def test_order_and_content_are_the_source_s(items, depth):
    assert list(read_ahead(iter(items), depth)) == items


def test_an_error_arrives_after_the_items_before_it():
    def source():
        yield 1
        yield 2
        raise ValueError("row 3 is broken")

    got = []
    with pytest.raises(ValueError, match="row 3"):
        for item in read_ahead(source(), 4):
            got.append(item)
    assert got == [1, 2]


def test_never_more_than_depth_ahead_and_an_early_stop_closes_the_source():
    produced = []
    closed = threading.Event()

    def source():
        try:
            for k in range(1000):
                produced.append(k)
                yield k
        finally:
            closed.set()

    stream = read_ahead(source(), 3)
    assert next(stream) == 0
    time.sleep(0.3)  # the producer fills the queue, then waits
    # consumed 1, queue holds 3, and one item may be held by the blocked put
    assert len(produced) <= 1 + 3 + 1
    stream.close()
    assert closed.wait(2), "the source generator was not closed when the consumer stopped"
    assert not any(t.name == "hs-read-ahead" and t.is_alive() for t in threading.enumerate())

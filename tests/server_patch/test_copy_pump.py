"""The copy pump's slicing (:mod:`hs_dataset.server_patch.copy_pump`), on CPU: which copies share an event, and how many wait.

CPU torch has no CUDA streams or events; the pump's own logic -- cut each tensor into slices,
record a blocking-sync event after at most ``slice_bytes`` queued, wait for the oldest while
``in_flight`` are pending -- runs here against a stand-in event that records what was queued
before it, and CPU copies (``non_blocking`` is a no-op on the host).
"""

from __future__ import annotations

import contextlib
import itertools
from typing import ClassVar

import pytest
import torch

from hs_dataset.server_patch.copy_pump import CopyDone, CopyPump, _Job


class FakeEvent:
    """Records, when recorded, how many bytes had been copied so far; ``synchronize`` notes that it was waited for."""

    made: ClassVar[list[FakeEvent]] = []

    def __init__(self, blocking: bool = False) -> None:
        self.blocking = blocking
        self.at_bytes = -1
        self.waited = False
        FakeEvent.made.append(self)

    def record(self, stream=None) -> None:
        self.at_bytes = COPIED[0]

    def synchronize(self) -> None:
        self.waited = True


COPIED = [0]


class FakeStream:
    def wait_event(self, event) -> None:
        pass


@pytest.fixture
def pump(monkeypatch):
    FakeEvent.made = []
    COPIED[0] = 0
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    original_copy = torch.Tensor.copy_

    def counting_copy(self, src, non_blocking=False):
        COPIED[0] += src.numel() * src.element_size()
        return original_copy(self, src)

    monkeypatch.setattr(torch.Tensor, "copy_", counting_copy)
    p = CopyPump.__new__(CopyPump)  # no thread, no CUDA stream: _copy alone
    p.slice_bytes, p.in_flight, p._stream = 64, 2, FakeStream()
    return p


def _job(sizes: list[int]) -> tuple[_Job, list[torch.Tensor], list[torch.Tensor]]:
    srcs = [torch.arange(n, dtype=torch.uint8) for n in sizes]
    dsts = [torch.zeros(n, dtype=torch.uint8) for n in sizes]
    return _Job(list(zip(srcs, dsts, strict=True)), FakeEvent(), CopyDone()), srcs, dsts


def test_small_tensors_share_an_event_and_no_event_covers_more_than_a_slice(pump):
    job, srcs, dsts = _job([10, 20, 30, 5, 150, 7])  # 222 bytes, slices of 64
    FakeEvent.made = []
    pump._copy(job)
    assert all(torch.equal(s, d) for s, d in zip(srcs, dsts, strict=True))
    events = [e for e in FakeEvent.made if e.at_bytes >= 0]
    marks = [0] + [e.at_bytes for e in events]
    assert marks[-1] == 222 and all(e.blocking and e.waited for e in events)
    assert all(0 < b - a <= 64 for a, b in itertools.pairwise(marks))  # never more than a slice between events
    # the first three tensors (60 bytes) share one event; one event a tensor or slice made eight
    assert marks == [0, 60, 65, 129, 193, 222]


def test_a_job_of_one_small_tensor_waits_for_one_event(pump):
    job, srcs, dsts = _job([48])
    FakeEvent.made = []
    pump._copy(job)
    assert torch.equal(srcs[0], dsts[0]) and [e.at_bytes for e in FakeEvent.made] == [48]

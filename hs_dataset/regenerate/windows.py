"""Regeneration with a batch generator (the in-process model): fixed windows of the source order, turn k together.

A padded batch's numerics depend on which rows share it, so a batch generator is given
fixed windows of ``size`` conversations in source order: turn ``k`` of every
conversation of a window goes out in one ``generate`` call, for k = 1, 2, ... A window
is stored whole (one fsynced line) before its samples go on; a resumed build forms the
same windows, regenerates only a window that was not stored whole, with the same batch,
and so writes the same turns as an uninterrupted one. The generator and the capture
share one device here, so nothing would be gained by overlapping them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from hs_dataset.faults import crash_point
from hs_dataset.formats.regenerated import RegeneratedStore
from hs_dataset.formats.regenerated_record import ConversationRecord
from hs_dataset.regenerate.conversation import Finished, TurnRules, stored_record
from hs_dataset.regenerate.generator import Generator
from hs_dataset.sample import TokenizedSample, batches

__all__ = ["regenerate_in_windows"]


def regenerate_in_windows(
    samples: Iterable[TokenizedSample],
    size: int,
    generator: Generator,
    rules: TurnRules,
    store: RegeneratedStore,
    on_tokens: Callable[[int], None] = lambda n: None,
) -> Iterator[Finished]:
    """Each sample with its record, window by window (the stored record where there is one)."""
    for window in batches(samples, size):
        missing = [s for s in window if s.sample_id not in store]
        fresh = {}
        if missing:
            records = _regenerate_window(missing, generator, rules, on_tokens)
            store.append_chunk([r.to_json() for r in records])
            crash_point("regenerate.after_chunk")
            fresh = {r.sample_id: r for r in records}
        for sample in window:
            record = fresh.get(sample.sample_id)
            yield sample, record or stored_record(store, sample), record is not None


def _regenerate_window(
    window: list[TokenizedSample], generator: Generator, rules: TurnRules, on_tokens: Callable[[int], None]
) -> list[ConversationRecord]:
    """Turn k of every conversation of the window in one generate call, for k = 1, 2, ..."""
    convs = [rules.start(sample) for sample in window]
    while True:
        asked = [(c, rules.next_prompt(c)) for c in convs if c.more]
        ready = [(c, p) for c, p in asked if p is not None]
        if not asked:
            break
        if not ready:
            continue
        results = generator.generate([p for _, p in ready], rules.params)
        for (conv, prompt), result in zip(ready, results):
            rules.take_turn(conv, prompt, result)
            on_tokens(len(result.token_ids))
    return [rules.record(c) for c in convs]

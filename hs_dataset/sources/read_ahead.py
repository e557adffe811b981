"""Produce samples on a background thread, a bounded number ahead of the consumer.

Reading rows and rendering chat templates costs a few milliseconds per sample, all
of it on the thread that also feeds the capture backend; done in line, the server
waits for the tokenizer between windows. A producer thread keeps up to ``depth``
samples ready, in the source's order, so tokenization overlaps with capture.
Errors raised by the source reach the consumer at the point they occurred; a
consumer that stops early stops the producer.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

__all__ = ["read_ahead"]

T = TypeVar("T")

_DONE = object()
_POLL_S = 0.1


class _Raised:
    """An exception of the producer, carried to the consumer in order."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def read_ahead(items: Iterable[T], depth: int, *, name: str = "hs-read-ahead") -> Iterator[T]:
    """Yield ``items`` in order while a thread computes up to ``depth`` of them ahead.

    ``depth <= 0`` iterates in line (no thread), for callers that must not start one.
    """
    if depth <= 0:
        yield from items
        return
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        source = iter(items)
        try:
            for item in source:
                if not put(item):
                    return
        except BaseException as error:  # noqa: BLE001 - handed to the consumer, re-raised there
            put(_Raised(error))
            return
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()  # a generator's own finally (open files) runs on its thread, now
        put(_DONE)

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item = ready.get()
            if item is _DONE:
                return
            if isinstance(item, _Raised):
                raise item.error
            yield item
    finally:
        stop.set()
        thread.join()

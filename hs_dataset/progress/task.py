"""One long loop's progress: counted as it advances, shown as a bar on a terminal, else as a plain line every interval.

Every command's loop (build, regeneration, export, import, merge, verify, push) opens one
:class:`Task`, so each shows the same line the same way (:mod:`hs_dataset.progress.format`).
Without settings (:func:`~hs_dataset.progress.settings.active` is None) a task counts and
shows nothing. A line is written when the task advances past the interval, and by a
heartbeat thread while it does not, then a final line when it closes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from hs_dataset.progress.format import Snapshot, fields, line
from hs_dataset.progress.settings import ProgressSettings, active

__all__ = ["BAR_REFRESH_S", "Task", "task"]

BAR_REFRESH_S = 0.5  # a bar's rates are recomputed at most this often

Sizes = Callable[[], tuple[int, int]]  # (bytes written, of which held in a shard not yet published)
Detail = Callable[[float], Sequence[str]]  # elapsed seconds -> the task's own parts of the line
T = TypeVar("T")


class Task:
    """Counts of one loop: ``done`` items of ``total`` (None: unknown), tokens, and bytes.

    The bytes come from ``sizes`` where the loop's writer knows them (an open shard's
    included), else from what :meth:`advance` was told; a task told of none shows none.

    ``verb`` names what happens to the bytes (written, read, linked, uploaded); ``detail``
    adds the task's own parts (the regeneration's conversations of this run); ``tokens_label``
    says which tokens are counted (the regeneration's are generated ones).
    """

    def __init__(
        self,
        name: str,
        unit: str,
        total: int | None = None,
        *,
        settings: ProgressSettings | None = None,
        verb: str = "written",
        sizes: Sizes | None = None,
        detail: Detail | None = None,
        tokens_label: str = "tokens",
    ) -> None:
        self.name, self.unit, self.total, self.verb, self.tokens_label = name, unit, total, verb, tokens_label
        self.done = self.fresh = self.tokens = self.nbytes = 0
        self._settings = settings
        self._sizes, self._detail = sizes, detail
        self._lock = threading.Lock()  # counters and output: the regeneration advances from its pump's thread
        self._clock = settings.clock if settings is not None else None
        self._started = self._shown = self._clock() if self._clock is not None else 0.0
        self._closed = False
        self._bar = _bar(name, unit, total, settings) if settings is not None and settings.wants_bar() else None
        self._stop = threading.Event()
        if settings is not None and self._bar is None and settings.interval_s > 0:
            self._write(self.line())  # a log shows at once that the loop began, and its total
            if settings.heartbeat:
                threading.Thread(target=self._beat, name=f"hs-progress-{name}", daemon=True).start()

    # ------------------------------------------------------------------ counting
    def advance(self, n: int = 1, *, tokens: int = 0, nbytes: int = 0, fresh: bool = True) -> None:
        """``n`` items done (``fresh``: by this run; False: found done, e.g. resumed, which the ETA does not time)."""
        with self._lock:
            self.done += n
            self.fresh += n if fresh else 0
            self.tokens += tokens
            self.nbytes += nbytes
            if self._bar is not None and n:
                self._bar.update(n)
        self.tick()

    def add_tokens(self, tokens: int) -> None:
        """Tokens counted apart from items (a generated answer arrives before its conversation is done)."""
        with self._lock:
            self.tokens += tokens
        self.tick()

    def track(
        self, items: Iterable[T], *, tokens: Callable[[T], int] | None = None, nbytes: Callable[[T], int] | None = None
    ) -> Iterator[T]:
        """``items``, each counted done once the loop's body returns for it; the task closes when the loop ends.

        A loop left early (an error, a ``break``) closes it as stopped.
        """
        ok = False
        try:
            for item in items:
                yield item
                self.advance(tokens=tokens(item) if tokens else 0, nbytes=nbytes(item) if nbytes else 0)
            ok = True
        finally:
            self.close(ok=ok)

    def set_total(self, total: int | None) -> None:
        """The total once known (a source counted late)."""
        with self._lock:
            self.total = total
            if self._bar is not None:
                self._bar.total = total

    # ------------------------------------------------------------------ showing
    def snapshot(self) -> Snapshot:
        now = self._clock() if self._clock is not None else 0.0
        elapsed = max(now - self._started, 0.0)
        written, held = self._sizes() if self._sizes is not None else (self.nbytes or None, 0)
        detail = tuple(self._detail(elapsed)) if self._detail is not None else ()
        return Snapshot(
            self.name,
            self.unit,
            self.done,
            self.total,
            self.fresh,
            self.tokens,
            elapsed,
            self.verb,
            written,
            held,
            detail,
            self.tokens_label,
        )

    def line(self, *, final: bool = False, stopped: bool = False) -> str:
        return line(self.snapshot(), final=final, stopped=stopped)

    def tick(self) -> None:
        """Show the progress if it is due: a bar's rates every ``BAR_REFRESH_S``, a plain line every interval."""
        settings, clock = self._settings, self._clock
        if settings is None or clock is None:
            return
        with self._lock:
            if self._closed:
                return
            now = clock()
            if self._bar is not None:
                if now - self._shown >= BAR_REFRESH_S:
                    self._bar.set_postfix_str(", ".join(fields(self.snapshot())), refresh=False)
                    self._shown = now
            elif settings.interval_s > 0 and now - self._shown >= settings.interval_s:
                self._write(self.line())
                self._shown = now

    def close(self, *, ok: bool = True) -> None:
        """The final line (or the bar's last state); ``ok`` False: the loop failed, and the line says it stopped. Idempotent."""
        with self._lock:
            if self._closed or self._settings is None:
                self._closed = True
                return
            self._closed = True
            self._stop.set()
            if self._bar is not None:
                self._bar.set_postfix_str(", ".join(fields(self.snapshot())), refresh=False)
                self._bar.close()
            else:
                self._write(self.line(final=True) if ok else self.line(stopped=True))

    def _write(self, text: str) -> None:
        assert self._settings is not None
        out = self._settings.output()
        out.write(text + "\n")
        out.flush()

    def _beat(self) -> None:
        assert self._settings is not None
        wait = min(self._settings.interval_s, 5.0)
        while not self._stop.wait(wait):
            self.tick()

    def __enter__(self) -> Task:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(ok=exc_type is None)


def task(
    name: str,
    unit: str,
    total: int | None = None,
    *,
    verb: str = "written",
    sizes: Sizes | None = None,
    detail: Detail | None = None,
    settings: ProgressSettings | None = None,
) -> Task:
    """A task shown under ``settings``, else under the command line's (:func:`active`); silent when neither is set."""
    return Task(name, unit, total, settings=settings or active(), verb=verb, sizes=sizes, detail=detail)


def _bar(name: str, unit: str, total: int | None, settings: ProgressSettings) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, unit=unit.rstrip("s") or unit, dynamic_ncols=True, desc=name, file=settings.output())

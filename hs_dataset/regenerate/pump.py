"""Regeneration with a streaming generator (SGLang servers): conversations flow through the servers continuously.

``slots`` conversations are carried at once, one request each, so that many requests are
in flight at all times: a conversation's next turn is asked for the moment its previous
answer arrives, and a slot whose conversation finished takes the next one at once. A
finished conversation is stored (the records finished together share one fsynced line)
and handed on to capture straight away while the other slots keep generating, so the
server batches capture prefills together with the decodes.

Every stage is bounded, so memory does not grow with the source, and a stage that falls
behind (capture, the disk) holds the ones before it::

    source --todo (2 x slots)--> slots --finished (slots)--> store --ready (slots)--> consumer

A record is stored whole or not at all, before its sample goes on; a sample whose record
is already stored is handed on without generation. The pump runs on its own thread with
its own asyncio loop; the generator's futures are awaited there.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hs_dataset.faults import crash_point
from hs_dataset.formats.regenerated import RegeneratedStore
from hs_dataset.regenerate.conversation import Conversation, Finished, TurnRules, stored_record
from hs_dataset.regenerate.generator import GenerationResult, StreamingGenerator
from hs_dataset.sample import TokenizedSample

__all__ = ["ConversationPump"]

_END = object()
MAX_CHUNK_RECORDS = 64  # records per stored line: a resumed build parses at most this many to read one


class ConversationPump:
    """Keep ``slots`` conversations in flight on ``generator``; see the module docstring."""

    def __init__(
        self,
        generator: StreamingGenerator,
        rules: TurnRules,
        store: RegeneratedStore,
        slots: int,
        on_tokens: Callable[[int], None] = lambda n: None,
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.generator = generator
        self.rules = rules
        self.store = store
        self.slots = slots
        self.on_tokens = on_tokens
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._error: BaseException | None = None

    def run(self, samples: Iterable[TokenizedSample]) -> Iterator[Finished]:
        """Each sample with its record and whether this run regenerated it, in the order they are stored.

        An error of the source is raised after the conversations already taken are
        finished and stored; a consumer that stops early stops the pump.
        """
        started = threading.Event()
        thread = threading.Thread(target=self._thread, args=(iter(samples), started), name="hs-regenerate", daemon=True)
        thread.start()
        started.wait()
        loop, ended = self._loop, False
        try:
            while True:
                item = asyncio.run_coroutine_threadsafe(self._take(), loop).result()
                if item is _END:
                    ended = True
                    break
                yield item
            if self._error is not None:
                raise self._error
        finally:
            if not ended and not loop.is_closed():  # closed: the loop's thread already ended (a signal stopped it)
                try:
                    loop.call_soon_threadsafe(self._task.cancel)
                except RuntimeError:  # closed between the check and the call
                    pass
            thread.join()

    def _thread(self, samples: Iterator[TokenizedSample], started: threading.Event) -> None:
        try:
            asyncio.run(self._main(samples, started))
        except asyncio.CancelledError:
            pass  # the consumer stopped early

    # ------------------------------------------------------------------ the stages, on the pump's loop
    async def _main(self, samples: Iterator[TokenizedSample], started: threading.Event) -> None:
        self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
        self._todo: asyncio.PriorityQueue = asyncio.PriorityQueue(2 * self.slots)
        self._finished: asyncio.Queue = asyncio.Queue(self.slots)
        self._ready: asyncio.Queue = asyncio.Queue(self.slots)
        started.set()
        reader = ThreadPoolExecutor(1, thread_name_prefix="hs-regenerate-source")
        self._render = ThreadPoolExecutor(1, thread_name_prefix="hs-regenerate-render")  # one: a tokenizer is not shared safely
        tasks: list[asyncio.Task] = []
        try:
            tasks = [
                asyncio.create_task(self._feed(samples, reader)),
                asyncio.create_task(self._generate()),
                asyncio.create_task(self._store()),
            ]
            await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            raise
        except BaseException as exc:  # noqa: BLE001 - carried to the consumer's thread and raised there
            self._error = exc
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            reader.shutdown(wait=False, cancel_futures=True)
            self._render.shutdown(wait=False, cancel_futures=True)
        await self._ready.put(_END)
        await self._ready.join()  # the loop lives until the consumer took everything, the end mark included

    async def _take(self) -> Any:
        """The consumer's next item (run on this loop from the consumer's thread)."""
        item = await self._ready.get()
        self._ready.task_done()
        return item

    async def _feed(self, samples: Iterator[TokenizedSample], reader: ThreadPoolExecutor) -> None:
        """Samples from the source (read on its own thread) to the slots; then one end mark per slot.

        The slots take, of the next ``2 * slots`` conversations, a stored one first, then the
        one with the most turns to regenerate (ties in source order): a long chain of turns
        started last would leave the servers nearly idle at the end of the run.
        """
        loop = asyncio.get_running_loop()
        seq = itertools.count()
        try:
            while (sample := await loop.run_in_executor(reader, next, samples, None)) is not None:
                stored = sample.sample_id in self.store
                turns = 0 if stored else len(self.rules.start(sample).turns)
                await self._todo.put((0, not stored, -turns, next(seq), sample))
        except Exception as exc:  # noqa: BLE001 - the source's error: the conversations taken are finished first
            self._error = exc
        for _ in range(self.slots):
            await self._todo.put((1, True, 0, next(seq), None))

    async def _generate(self) -> None:
        await asyncio.gather(*(self._slot() for _ in range(self.slots)))
        await self._finished.put(_END)

    async def _slot(self) -> None:
        """One conversation after another, each turn sent the moment the previous answer arrived.

        Answers are decoded and prompts rendered on the render thread (a chat template costs
        milliseconds; the tokenizer is used by that one thread only), so the loop keeps
        sending the other slots' turns meanwhile.
        """
        loop = asyncio.get_running_loop()
        while (sample := (await self._todo.get())[-1]) is not None:
            if sample.sample_id in self.store:
                await self._ready.put((sample, stored_record(self.store, sample), False))
                continue
            conv = self.rules.start(sample)
            prompt = await loop.run_in_executor(self._render, self._advance, conv, None, None)
            while prompt is not None:
                result = await asyncio.wrap_future(self.generator.submit(prompt, self.rules.params))
                self.on_tokens(len(result.token_ids))
                prompt = await loop.run_in_executor(self._render, self._advance, conv, prompt, result)
                crash_point("regenerate.after_turn")
            await self._finished.put((conv.finished_sample(), self.rules.record(conv)))

    def _advance(self, conv: Conversation, prompt: list[int] | None, result: GenerationResult | None) -> list[int] | None:
        """The answer to ``prompt`` taken (when given), then the next turn's prompt (None: the conversation is done)."""
        if prompt is not None and result is not None:
            self.rules.take_turn(conv, prompt, result)
        return self.rules.next_prompt(conv)

    async def _store(self) -> None:
        """Store what finished (together, one line) off the loop, then hand each on."""
        loop = asyncio.get_running_loop()
        while True:
            batch: list[Any] = [await self._finished.get()]
            while len(batch) < MAX_CHUNK_RECORDS and not self._finished.empty():
                batch.append(self._finished.get_nowait())
            done = batch[-1] is _END
            batch = [item for item in batch if item is not _END]
            if batch:
                await loop.run_in_executor(None, self.store.append_chunk, [record.to_json() for _, record in batch])
                crash_point("regenerate.after_chunk")
                for sample, record in batch:
                    await self._ready.put((sample, record, True))
            if done:
                return

"""The events of one generation and the stream that carries them from the generating thread to one consumer.

Invariants: a stream ends with exactly one terminal item, a `Finished` event or the error that stopped the
generation (raised to the consumer); events arrive in the order they were produced; the consumer is a thread
(plain iteration) or an event loop (async iteration), never both. The producer never blocks on the consumer: a
slow consumer finds several events waiting and takes them in one `batch` (one socket write instead of one per
token), so a loop that falls behind catches up instead of costing a thread switch per token.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Literal

from edged.backends.tool_calls import ToolCall

FinishReason = Literal["stop", "length", "cancelled", "tool_calls"]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int  # tokens generated, the end-of-sequence token not counted


@dataclass(frozen=True)
class Started:
    """The request holds a sequence slot and its prompt was read: text follows."""

    prompt_tokens: int


@dataclass(frozen=True)
class TextDelta:
    text: str  # never empty


@dataclass(frozen=True)
class Finished:
    """``stop``: end of sequence or a stop string; ``length``: ``max_tokens``; ``cancelled``: by the consumer;
    ``tool_calls``: the answer ended in the calls ``tool_calls`` (engine/tool_output.py)."""

    reason: FinishReason
    usage: Usage
    tool_calls: tuple[ToolCall, ...] = ()


GenerationEvent = Started | TextDelta | Finished


class GenerationStream:
    def __init__(self) -> None:
        self._items: deque[GenerationEvent | BaseException] = deque()
        self._ready = threading.Condition()
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        self._cancelled = threading.Event()
        self._ended = False  # the consumer has taken the terminal item

    # --- consumer side -------------------------------------------------------------------------------------
    def cancel(self) -> None:
        """Stop the generation before its next token; the stream then ends with ``Finished("cancelled")``."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def __iter__(self) -> Iterator[GenerationEvent]:
        while not self._ended:
            with self._ready:
                while not self._items:
                    self._ready.wait()
                items = list(self._items)
                self._items.clear()
            yield from self._unpack(items)

    async def batches(self) -> AsyncIterator[list[GenerationEvent]]:
        """The events as they come, each batch holding all that were waiting (at least one)."""
        while not self._ended:
            loop = asyncio.get_running_loop()
            with self._ready:
                future: asyncio.Future[None] | None = None
                if not self._items:
                    future = loop.create_future()
                    self._waiter = (loop, future)
            if future is not None:
                await future
            with self._ready:
                items = list(self._items)
                self._items.clear()
            yield list(self._unpack(items))

    async def events(self) -> AsyncIterator[GenerationEvent]:
        async for batch in self.batches():
            for event in batch:
                yield event

    def _unpack(self, items: list[GenerationEvent | BaseException]) -> Iterator[GenerationEvent]:
        for item in items:
            if isinstance(item, BaseException):
                self._ended = True
                raise item
            if isinstance(item, Finished):
                self._ended = True
            yield item

    # --- producer side -------------------------------------------------------------------------------------
    def put(self, item: GenerationEvent | BaseException) -> bool:
        """Hand over one item; True when it woke an event loop that was waiting for it."""
        with self._ready:
            self._items.append(item)
            self._ready.notify()
            waiter, self._waiter = self._waiter, None
        if waiter is None:
            return False
        loop, future = waiter
        try:
            loop.call_soon_threadsafe(_wake, future)
        except RuntimeError:  # the consumer's loop is closed: nobody is left to read the stream
            self._cancelled.set()
            return False
        return True

    @property
    def cancel_requested(self) -> threading.Event:
        return self._cancelled


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():  # the consumer's task may have been cancelled meanwhile
        future.set_result(None)

"""The events of one generation and the stream that carries them from the generating thread to one consumer.

Invariants: a stream ends with exactly one terminal item, a `Finished` event or the error that stopped the
generation (raised to the consumer); events arrive in the order they were produced; there is one consumer: a
thread (plain iteration), a coroutine (async iteration) or a callback on an event loop (``deliver_to``). The
producer never blocks on the consumer: a slow consumer finds several events waiting and takes them in one
batch (one socket write instead of one per token), so a loop that falls behind catches up instead of costing
a thread switch per token.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
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
Sink = Callable[[list["GenerationEvent"], "BaseException | None"], None]  # (events, the terminal error or None)


class GenerationStream:
    def __init__(self) -> None:
        self._items: deque[GenerationEvent | BaseException] = deque()
        self._ready = threading.Condition()
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        # deliver_to: the loop and callback that get every batch, and whether a delivery is already scheduled
        self._sink: tuple[asyncio.AbstractEventLoop, Sink] | None = None
        self._scheduled = False
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

    def deliver_to(self, loop: asyncio.AbstractEventLoop, callback: Sink) -> None:
        """Have ``callback(events, error)`` called on ``loop`` with each batch of events, the terminal error as
        ``error``: the cheapest consumer for an event loop (one callback per batch, no task, no future)."""
        with self._ready:
            self._sink = (loop, callback)
            pending = bool(self._items)
            self._scheduled = pending
        if pending:
            loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._ready:
            items = list(self._items)
            self._items.clear()
            self._scheduled = False
            sink = self._sink
        if sink is None or not items:
            return
        error = items[-1] if isinstance(items[-1], BaseException) else None
        events = [item for item in items if not isinstance(item, BaseException)]
        sink[1](events, error)

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
    def put(self, item: GenerationEvent | BaseException, wake: bool = True) -> bool:
        """Hand over one item; True when it woke an event loop that was waiting for it. ``wake`` False: only
        queue it, for the next waking put to deliver (the producer bounds how long that can be)."""
        with self._ready:
            self._items.append(item)
            if not wake:
                return False
            self._ready.notify()
            waiter, self._waiter = self._waiter, None
            sink = self._sink if not self._scheduled else None
            if sink is not None:
                self._scheduled = True
        try:
            if sink is not None:
                sink[0].call_soon_threadsafe(self._deliver)
                return True
            if waiter is not None:
                waiter[0].call_soon_threadsafe(_wake, waiter[1])
                return True
        except RuntimeError:  # the consumer's loop is closed: nobody is left to read the stream
            self._cancelled.set()
        return False

    @property
    def cancel_requested(self) -> threading.Event:
        return self._cancelled


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():  # the consumer's task may have been cancelled meanwhile
        future.set_result(None)

"""Inference from asyncio code: requests awaited on one event loop are submitted together.

Every request awaited during one turn of the loop is queued in a single group commit (one `submit_many` per
model version), so concurrent coroutines batch without a thread hand-off per request — the cost that keeps
thread-per-request callers from batching well in a GIL-bound process (docs/benchmarks.md). The service's
intake is open from the first such request to the commit, so a batch whose delay ends meanwhile waits for
them (edged.engine.intake).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from edged.engine.types import InferRequest, InferResponse
from edged.errors import EdgedError

if TYPE_CHECKING:
    from edged.engine.service import InferenceService

Done = Callable[[InferResponse | EdgedError], None]


class LoopSubmitter:
    """Collects one loop iteration's requests and submits them per model version (one per event loop)."""

    def __init__(self, service: InferenceService, loop: asyncio.AbstractEventLoop) -> None:
        self._service = service
        self.loop = loop
        self._loop_thread = threading.get_ident()  # created from a coroutine: this is the loop's thread
        self._pending: dict[tuple[str, str], list[tuple[InferRequest, Done]]] = {}

    def queue(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        """Queue ``request`` for this loop turn's submission; the future resolves with its response."""
        future: asyncio.Future[InferResponse] = self.loop.create_future()
        pending = self._pending
        if not pending:
            self._service.intake.open()
            self.loop.call_soon(self._flush)
        key = (request.model, request.version)
        calls = pending.get(key)
        if calls is None:
            calls = pending[key] = []
        calls.append((request, self._completion(future)))
        return future

    def _completion(self, future: asyncio.Future[InferResponse]) -> Done:
        loop = self.loop
        loop_thread = self._loop_thread

        def done(result: InferResponse | EdgedError) -> None:
            if threading.get_ident() != loop_thread:  # a worker thread finished it
                if not loop.is_closed():
                    loop.call_soon_threadsafe(_settle, future, result)
                return
            _settle(future, result)

        return done

    def _flush(self) -> None:
        pending, self._pending = self._pending, {}
        service = self._service
        try:
            for (model, version), calls in pending.items():
                service.submit_many(model, version, calls, inline=service.should_inline(model, version))
        finally:
            service.intake.close()


def _settle(future: asyncio.Future[InferResponse], result: InferResponse | EdgedError) -> None:
    if future.done():
        return  # the awaiting task was cancelled
    if isinstance(result, EdgedError):
        future.set_exception(result)
    else:
        future.set_result(result)

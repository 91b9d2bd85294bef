"""The write half of a connection: responses in request order, back-pressure, and the lingering close.

Invariants (see `edged.serving._http` for the whole connection's): a slot is written only once every slot before
it has been; a response that closes the connection is the last thing written on it; closing sends our FIN
first and then reads and drops what the client still sends, so that a client owed an answer is never reset.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING

from edged.serving._access import UNKNOWN_PEER, Peer
from edged.serving._limits import unread_bytes
from edged.serving._messages import Slot
from edged.serving._response import Response, error_response, render

if TYPE_CHECKING:
    from edged.serving._app import App

log = logging.getLogger(__name__)

MAX_PIPELINED = 32  # responses owed on one connection before we stop reading from it
LINGER_S = 1.0  # how long a closing connection waits for the client's FIN before it is closed anyway


class Responder:
    def __init__(self, app: App, kind: str) -> None:
        self.app = app
        self.kind = kind
        self.peer: Peer = UNKNOWN_PEER
        self.request_started = 0.0  # loop time the current request's first byte came; 0 between requests
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._slots: deque[Slot] = deque()
        self._reserved = 0  # budget bytes taken for the request being read
        self._closing = False
        self._reading_paused = False
        self._writing_paused = False
        self._linger: asyncio.TimerHandle | None = None

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._update_reading()

    # --- responses -----------------------------------------------------------------------------------------
    def respond(self, slot: Slot, data: bytes, close: bool = False) -> None:
        """Fill ``slot``; writes it, and any filled slots after it, once the slots before it are written."""
        app = self.app
        app.active -= 1
        if slot.reserved:
            app.body_budget.used -= slot.reserved  # BodyBudget.release without the call
            slot.reserved = 0
        slot.data = data
        slot.close = close
        slots = self._slots
        if not slots or slots[0] is not slot:
            return
        transport = self._transport
        while slots and slots[0].data is not None:
            done = slots.popleft()
            if transport is None:
                continue
            if done.pending:
                transport.write(b"".join(done.pending))
                done.pending = None
            transport.write(done.data)  # type: ignore[arg-type]
            if done.close:
                self._close_after_write()
                return
        if slots and slots[0].pending and transport is not None:
            transport.write(b"".join(slots[0].pending))  # a stream that is now first in line
            slots[0].pending = None
        if self._reading_paused:
            self._update_reading()

    def stream(self, slot: Slot, data: bytes) -> bool:
        """Write a part of ``slot``'s response now if it is first in line, else keep it for then; ``respond``
        writes the last part. False once the connection is gone (the caller stops producing)."""
        transport = self._transport
        if transport is None or self._closing:
            return False
        if self._slots and self._slots[0] is slot and not slot.pending:
            transport.write(data)
        elif slot.pending is None:
            slot.pending = [data]
        else:
            slot.pending.append(data)
        return True

    def fail(self, slot: Slot, error: BaseException, keep_alive: bool) -> None:
        """Answer ``slot`` with a 500 for an unexpected exception, unless it was already answered."""
        log.error("internal error while handling a request", exc_info=error)
        if slot.data is None:
            body = error_response(500, f"internal server error: {type(error).__name__}")
            self.respond(slot, render(body, keep_alive), not keep_alive)

    def reject(self, status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        """Answer a request we will not read to the end, after the responses already owed, then close."""
        self._release_reserved()
        if self._closing:
            return
        self._closing = True
        self.request_started = 0.0
        log.info("closing a %s connection from %s: %d %s", self.kind, self.peer.describe(), status, message)
        slot = Slot()
        self._slots.append(slot)
        self.app.active += 1
        response = Response(status, error_response(status, message).body, extra_headers=headers, close=True)
        self.respond(slot, render(response, keep_alive=False), close=True)

    def close_idle(self) -> None:
        """Close a connection that owes nothing, unless a request is already waiting to be read."""
        transport = self._transport
        if transport is None or self._slots or self._linger is not None or unread_bytes(transport):
            return
        self._closing = True
        self._close_gracefully()

    def close_now(self) -> None:
        self._closing = True
        if self._transport is not None:
            self._transport.close()

    @property
    def idle(self) -> bool:
        return not self._slots and not self.request_started

    def _close_after_write(self) -> None:
        self._closing = True
        self._slots.clear()
        self._close_gracefully()

    def _close_gracefully(self) -> None:
        """Send our FIN after what was written, drop what the client still sends, close on its FIN or later."""
        transport = self._transport
        if transport is None or self._linger is not None:
            return
        if not transport.can_write_eof():
            transport.close()
            return
        try:
            transport.write_eof()
        except OSError:  # the peer is gone already (ENOTCONN after its reset): nothing left to say to it
            transport.close()
            return
        self._linger = self._loop.call_later(LINGER_S, transport.close)
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None:
            return
        if self._linger is not None:
            return  # a closing connection keeps reading, to drop what the client sends instead of resetting it
        should_pause = self._writing_paused or len(self._slots) > MAX_PIPELINED
        if should_pause and not self._reading_paused:
            self._reading_paused = True
            transport.pause_reading()
        elif not should_pause and self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()


    def _release_reserved(self) -> None:
        if self._reserved:
            self.app.body_budget.release(self._reserved)
            self._reserved = 0

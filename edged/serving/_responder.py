"""The write half of a connection: responses in request order, back-pressure, and the lingering close.

Invariants (see `edged.serving._http` for the whole connection's): a slot is written only once every slot before
it has been; a response that closes the connection is the last thing written on it; closing sends our FIN
first and then reads and drops what the client still sends, so that a client owed an answer is never reset.

A client's FIN is not a hang-up: HTTP/1.1 lets a client half-close and still read (``nc -N``, some proxies),
so what it is owed is still written, and the connection closes once it owes nothing. Only a generation (chat,
completions, generate) or an infer request (which may wait in a model's queue for its batching delay) is worth
stopping for a client that is gone, so while one is owed the socket is looked at soon after the FIN and then
every second: on a Unix socket a peer that closed shows as a hang-up (POLLHUP; a
half-close does not); over TCP a FIN cannot tell, but a socket the client closed answers the next bytes sent to
it with a reset, so an interim ``100 Continue`` goes out first (legal before the final response of an HTTP/1.1
request, and skipped by its clients) unless a response has begun or the client spoke HTTP/1.0 (which knows no
1xx), and the reset shows as the socket's error. A client found gone, or a failed write, closes the connection,
whose loss cancels the generations and sets the connection's one `Cancellation`, which its infer requests
share: those still queued are dropped unrun (`RequestCancelled`, a failed request in the model's statistics).
A lost connection that was owed answers logs one line, whatever their number.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import socket
from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING

from edged.engine import Cancellation
from edged.serving._access import UNKNOWN_PEER, Peer
from edged.serving._limits import unread_bytes
from edged.serving._messages import Incoming, Slot
from edged.serving._openai import openai_error_response
from edged.serving._response import Response, error_response, render
from edged.serving._sse import failure

if TYPE_CHECKING:
    from edged.serving._app import App

log = logging.getLogger(__name__)

MAX_PIPELINED = 32  # responses owed on one connection before we stop reading from it
LINGER_S = 1.0  # how long a closing connection waits for the client's FIN before it is closed anyway
# Sent once over TCP to a half-closed client owed a generation: a client that closed its socket answers with a reset.
_INTERIM = b"HTTP/1.1 100 Continue\r\n\r\n"
# After a half-close, when the socket is looked at: at once (a Unix socket, loopback and a LAN have answered by
# then), a few times as a slow link's round trip may take, then every last one.
_GONE_CHECKS_S = (0.0, 0.002, 0.01, 0.05, 0.25, 1.0)


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
        self.write_stalled_since = 0.0  # loop time our writes paused (the client not reading); 0 while they flow
        self._linger: asyncio.TimerHandle | None = None
        self._front_begun = False  # a part of the first slot's response has been written
        self.interim_allowed = True  # no request on this connection spoke HTTP/1.0, which knows no 1xx answers
        self._gone_check: asyncio.TimerHandle | None = None
        self._peer_finished = False  # the client's FIN came: once nothing is owed, the connection is done
        # Shared by the infer requests of this connection: set when it is lost, so the queued ones are not run
        self.cancellation = Cancellation()
        self._gone_why = ""  # what showed a half-closed client gone, for connection_lost's log line

    def pause_writing(self) -> None:
        self._writing_paused = True
        self.write_stalled_since = self._loop.time()
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self.write_stalled_since = 0.0
        self._update_reading()

    def abandon_unread(self, timeout_s: float) -> None:
        """The client has read nothing of its answers for ``timeout_s``: drop them and the connection (a reset:
        a client that does not read gets no lingering close), rather than hold them in memory for good."""
        transport = self._transport
        if transport is None:
            return
        log.warning("closing a %s connection from %s: its answers stay unread for %.0f s (request_timeout_s); "
                    "%d answer(s) dropped", self.kind, self.peer.describe(), timeout_s, len(self._slots))
        self._closing = True
        self._gone_why = "its answers stayed unread"
        transport.abort()

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
        self._front_begun = False
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
            self._front_begun = True
        elif not slots and self._peer_finished:
            self._close_after_write()  # a client that half-closed sends no further request
            return
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
            self._front_begun = True
        elif slot.pending is None:
            slot.pending = [data]
        else:
            slot.pending.append(data)
        return True

    def half_closed(self) -> bool | None:
        """The client sent its FIN (``eof_received``): keep writing what it is owed, and if that includes a
        generation, find out whether the client is gone (see the module docstring). True keeps the write side
        open; None closes a connection that owes nothing."""
        if not self._slots:
            return None
        self._peer_finished = True
        if self._owes_cancellable():
            transport = self._transport
            if transport is not None and self.kind != "uds" and not self._front_begun and self.interim_allowed:
                transport.write(_INTERIM)
            self._check_gone(0)
        return True

    def _owes_cancellable(self) -> bool:
        """An unanswered generation or infer request: worth stopping if the client is gone."""
        return any(slot.cancel is not None and slot.data is None for slot in self._slots)

    def cancel_owed(self, exc: Exception | None) -> None:
        """The connection is lost (``connection_lost``; also after a half-closed client was found gone): stop
        what the client is still owed: its generations are cancelled, its queued infer requests dropped unrun.
        One log line per connection, however many requests it had."""
        self.cancellation.cancelled = True  # also for requests still being decoded or loaded for
        owed = [slot.cancel for slot in self._slots if slot.cancel is not None and slot.data is None]
        if not owed:
            return
        why = self._gone_why or ("the connection was lost" if exc is None else f"the connection was lost: {exc}")
        log.info("a %s client from %s is gone (%s) with %d answer(s) owed: its queued infer requests are dropped "
                 "unrun, its generations cancelled", self.kind, self.peer.describe(), why, len(owed))
        for cancel in owed:
            cancel()

    def _check_gone(self, checks: int) -> None:
        self._gone_check = None
        transport = self._transport
        if transport is None or not self._owes_cancellable():
            return
        gone = self._why_gone(transport)
        if gone is not None:
            self._gone_why = f"it half-closed, then: {gone}"
            transport.abort()  # connection_lost cancels what is owed
            return
        delay = _GONE_CHECKS_S[min(checks, len(_GONE_CHECKS_S) - 1)]
        self._gone_check = self._loop.call_later(delay, self._check_gone, checks + 1)

    def _why_gone(self, transport: asyncio.Transport) -> str | None:
        """Why a half-closed client cannot read any more, None while it can (as far as the socket tells)."""
        sock = transport.get_extra_info("socket")
        if sock is None:
            return None
        try:
            if self.kind == "uds":
                watch = select.poll()
                watch.register(sock.fileno(), select.POLLIN)
                events = watch.poll(0)
                return "it closed its socket" if events and events[0][1] & select.POLLHUP else None
            error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)  # EPIPE once its reset came
        except OSError:
            return None
        return os.strerror(error) if error else None

    def fail(self, slot: Slot, error: BaseException, keep_alive: bool) -> None:
        """Answer ``slot`` for an unexpected exception, unless it was already answered: a 500 in the shape of its
        route's API (OpenAI's error JSON under /v1), or, if its streamed response has begun, the stream's end."""
        log.error("internal error while handling a request", exc_info=error)
        if slot.data is not None:
            return
        begun = slot.pending is not None or (bool(self._slots) and self._slots[0] is slot and self._front_begun)
        url = slot.url if isinstance(slot, Incoming) else b""
        data, close = failure(url, error, begun, keep_alive)
        self.respond(slot, data, close)

    def openai_request(self) -> bool:
        """Whether the request being read is under /v1, whose refusals are OpenAI's error JSON."""
        return False

    def reject(self, status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = (),
               code: str | None = None) -> None:
        """Answer a request we will not read to the end, after the responses already owed, then close. Under
        /v1 the answer is OpenAI's error JSON (``code`` its code), elsewhere edged's."""
        self._release_reserved()
        if self._closing:
            return
        self._closing = True
        self.request_started = 0.0
        log.info("closing a %s connection from %s: %d %s", self.kind, self.peer.describe(), status, message)
        slot = Slot()
        self._slots.append(slot)
        self.app.active += 1
        if self.openai_request():
            response = replace(openai_error_response(status, message, code=code, headers=headers), close=True)
        else:
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
        self._gone_why = "the server closed the connection"  # a stop past its timeout: not the client's doing
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
        if self._peer_finished or not transport.can_write_eof():
            transport.close()  # after its FIN, the client sends nothing to read and drop: no reset to fear
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

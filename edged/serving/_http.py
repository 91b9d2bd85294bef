"""One HTTP/1.1 connection: an asyncio Protocol around the httptools parser.

Invariants: responses leave in request order (pipelining-safe: each request takes a slot in a queue and a
slot is written only once every slot before it has been); a connection that sent something malformed, too
large or too slow gets one 4xx response and is closed, and nothing it sent afterwards is read; a client that
does not read its responses stops being read from (pause_reading) instead of growing our buffers.

Closing never resets a client that is owed an answer: a connection closes with a lingering close (our FIN
first, then what the client still sends is read and dropped until its FIN or ``LINGER_S``), because closing a
socket with unread bytes sends a reset that can destroy the response the client has not read yet. An idle
connection with a request already waiting in the kernel's buffer is not closed at all: that request is read
and answered (with a 503 and ``connection: close`` while the server drains).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections import deque
from typing import TYPE_CHECKING

import httptools

from edged.protocol.shm_params import ShmReader
from edged.serving._access import UNKNOWN_PEER, Peer, peer_of
from edged.serving._limits import RETRY, over_limit_response, unread_bytes
from edged.serving._messages import WANTED_HEADERS, Incoming, Reject, Slot, header_int
from edged.serving._repeat import Repeat, learn
from edged.serving._response import Response, error_response, render

if TYPE_CHECKING:
    from edged.serving._app import App

# Slot, Incoming and header_int live in _messages; the front ends import them from here as well.
__all__ = ["LINGER_S", "MAX_PIPELINED", "WANTED_HEADERS", "Connection", "Incoming", "Slot", "header_int"]

log = logging.getLogger(__name__)

MAX_PIPELINED = 32  # responses owed on one connection before we stop reading from it
LINGER_S = 1.0  # how long a closing connection waits for the client's FIN before it is closed anyway
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# Bodies declared larger than this are checked against the largest body the target model can take before a
# byte of them is read; smaller ones cost too little to be worth the lookup.
_BOUND_CHECK_BYTES = 1024 * 1024


class Connection(asyncio.Protocol):
    def __init__(self, app: App, kind: str) -> None:
        self.app = app
        self.kind = kind
        self.peer: Peer = UNKNOWN_PEER
        self.shm_reader: ShmReader | None = None  # reads shared memory as this peer (set by the infer path)
        self.last_activity = 0.0
        self.request_started = 0.0  # loop time the current request's first byte came; 0 between requests
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._slots: deque[Slot] = deque()
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._header_bytes = 0
        self._body: list[bytes] = []
        # A large body declared by Content-Length is copied into one buffer as it arrives: joining its chunks
        # at the end would copy it all in one go on the loop (170 ms measured for 53 MB).
        self._buffer: bytearray | None = None
        self._body_bytes = 0
        self._reserved = 0  # budget bytes taken for the request being read
        self._refused = False  # accepted past max_connections, answered 503, lingering until closed
        self._closing = False
        self._reading_paused = False
        self._writing_paused = False
        self._linger: asyncio.TimerHandle | None = None
        self._limits = app.limits
        self._max_header_bytes = app.limits.max_header_bytes
        # bodies up to this size are within every limit but the in-flight budget (see _check_declared_length)
        self._small_body = min(_BOUND_CHECK_BYTES, app.limits.max_body_bytes)
        self._wanted_headers = app.wanted_headers  # WANTED_HEADERS and those access control reads
        self._wanted_lengths = app.wanted_lengths
        self.feeding = False  # inside data_received: requests it completes are flushed when it returns
        self._repeat: Repeat | None = None  # the last head that can be replayed without the parser (_repeat)
        self._in_message = False  # the parser has begun a request it has not completed
        self._head_alone = False  # a read held exactly the repeated head; its body is still to come
        self._fd = -1  # the socket's descriptor, for _read_now
        self._begins = 0  # requests begun in the current data_received call
        self._learnable: tuple[bytes, bytes, dict[bytes, bytes], bytes | bytearray, bool] | None = None

    # --- asyncio callbacks ---------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self.last_activity = self._loop.time()
        if len(self.app.connections) >= self.app.max_connections:
            self._refuse_over_limit(transport)  # type: ignore[arg-type]
            return
        sock = transport.get_extra_info("socket")
        with contextlib.suppress(OSError, AttributeError):
            self._fd = sock.fileno()
        if self.kind == "uds":
            try:
                self.peer = peer_of(sock)
            except (OSError, AttributeError):
                log.warning("could not read the peer credentials of a Unix-socket client")
        elif sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.app.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._fd = -1  # closed by the transport, and free to be reused by another socket
        self._closing = True
        if self._linger is not None:
            self._linger.cancel()
        self._release_reserved()
        for slot in self._slots:
            if slot.cancel is not None and slot.data is None:
                slot.cancel()
        if self._refused:
            self.app.refused.pop(self, None)
            return
        self.app.connections.discard(self)

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        self.last_activity = self._loop.time()
        repeat = self._repeat
        if repeat is not None and not self._in_message:  # a head seen before skips the parser (_repeat)
            if self._head_alone:  # the head came by itself: this should be its body
                self._head_alone = False
                if len(data) == repeat.length:
                    self.request_started = 0.0
                    self._replay(repeat, data)
                    return
                started = self.request_started
                self._release_reserved()
                self._feed(repeat.head + data)  # anything else: the parser, as if it had had the head then
                if self._in_message and self._begins == 1:
                    self.request_started = started
                return
            if len(data) == repeat.total and data.startswith(repeat.head):
                budget = self.app.body_budget  # _reserve_small and _replay without the calls: the common case
                if not self._reserved and budget.used + repeat.length <= budget.limit:
                    budget.used += repeat.length
                    self._reserved = repeat.length
                    self.feeding = True
                    try:
                        self._complete(repeat.method, repeat.url, repeat.headers, data[repeat.head_length:], True)
                    finally:
                        self.feeding = False
                    self.app.end_of_input(self)
                    return
            if len(data) == repeat.head_length and data == repeat.head and self._reserve_small(repeat.length):
                self._head_alone = True  # clients that send the head and the body apart (http.client)
                self.request_started = self.last_activity
                body = self._read_now(repeat.length)
                if body:
                    self.data_received(body)
                return
        self._feed(data)

    def _read_now(self, count: int) -> bytes:
        """Up to ``count`` bytes the socket already holds, read now: the body of a head that came alone is
        usually there by the time the head is handled, and reading it here saves a sleep in epoll and the
        wake-up after it (a good part of a small request's CPU on a VM, docs/benchmarks.md). Safe because the
        loop reads this socket only between callbacks, so nothing it reads later can come before these bytes."""
        if self._fd < 0 or self._reading_paused:
            return b""
        try:
            return os.read(self._fd, count)
        except OSError:  # EAGAIN: not there yet; anything worse, the loop's own read meets and reports
            return b""

    def _replay(self, repeat: Repeat, body: bytes) -> None:
        self.feeding = True
        try:
            self._complete(repeat.method, repeat.url, repeat.headers, body, True)
        finally:
            self.feeding = False
        self.app.end_of_input(self)

    def _feed(self, data: bytes) -> None:
        self._begins = 0
        self._learnable = None
        self.feeding = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.reject(400, "protocol upgrades (Upgrade, CONNECT) are not supported")
        except httptools.HttpParserCallbackError as e:
            cause = e.__context__
            if isinstance(cause, Reject):
                self.reject(cause.status, str(cause), cause.headers)
            else:
                log.error("internal error while handling a request", exc_info=cause)
                self.reject(500, "internal server error while parsing the request")
        except httptools.HttpParserError as e:
            self.reject(400, f"malformed HTTP request: {e}")
        finally:
            self.feeding = False
        if self._learnable is not None and self._begins == 1 and not self._in_message and not self._closing:
            self._repeat = learn(data, *self._learnable)
        self._learnable = None
        self.app.end_of_input(self)

    def eof_received(self) -> bool | None:
        # A client that hangs up while its answer is being generated is gone: HTTP clients do not half-close
        # while they wait (uvicorn reads EOF as a disconnect too), so its generation stops now, not at the
        # first write that fails.
        for slot in self._slots:
            if slot.cancel is not None and slot.data is None:
                slot.cancel()
        if self._slots:
            return True  # half-closed: keep the write side open for the responses still owed
        return None

    # --- parser callbacks ----------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.request_started = self.last_activity  # the loop time of this data_received call
        self._in_message = True
        self._begins += 1
        self._url = b""
        self._headers = {}
        self._header_bytes = 0
        self._body = []
        self._buffer = None
        self._body_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._header_bytes += len(url)
        if self._header_bytes > self._max_header_bytes:
            raise self._headers_too_large()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > self._max_header_bytes:
            raise self._headers_too_large()
        if len(name) not in self._wanted_lengths:
            return
        key = name.lower()
        if key not in self._wanted_headers:
            return
        if key in self._headers:
            self._headers[key] += b"," + value
        else:
            self._headers[key] = value

    def on_headers_complete(self) -> None:
        version = self._parser.get_http_version()
        if version not in ("1.1", "1.0"):
            raise Reject(505, f"HTTP version {version} is not supported; use HTTP/1.1")
        headers = self._headers
        if not headers:
            return
        length = headers.get(b"content-length")
        if length is not None and length.isdigit():
            declared = int(length)
            if declared > self._small_body or not self._reserve_small(declared):
                self._check_declared_length(declared)
        if headers.get(b"expect", b"").lower() == b"100-continue" and not self._slots and self._transport:
            self._transport.write(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self._limits.max_body_bytes:
            raise Reject(413, f"request body is larger than the limit of {self._limits.max_body_bytes} bytes")
        if self._body_bytes > self._reserved:  # a chunked body, or one longer than declared
            self._reserve(self._body_bytes)
        if self._buffer is not None:
            self._buffer += body  # grows by mremap, not by copying: the pages are touched as they arrive
        else:
            self._body.append(body)

    def on_message_complete(self) -> None:
        self.request_started = 0.0
        self._in_message = False
        if self._closing:
            self._release_reserved()
            return  # pipelined behind a response that closes the connection: the client must resend it
        body: bytes | bytearray
        if self._buffer is not None:
            body = self._buffer
        else:
            body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._buffer = None
        method = self._parser.get_method()
        keep_alive = self._parser.should_keep_alive()
        if self._begins == 1 and len(body) <= self._small_body:
            self._learnable = (method, self._url, self._headers, body, keep_alive)
        self._complete(method, self._url, self._headers, body, keep_alive)

    def _complete(self, method: bytes, url: bytes, headers: dict[bytes, bytes], body: bytes | bytearray,
                  keep_alive: bool) -> None:
        """Hand a whole request to the dispatcher, in a slot of its own."""
        request = Incoming(method, url, headers, body, keep_alive)
        slot = Slot()
        slot.reserved, self._reserved = self._reserved, 0
        self._slots.append(slot)
        self.app.active += 1
        if len(self._slots) > MAX_PIPELINED:
            self._update_reading()
        try:
            self.app.dispatch(self, request, slot)
        except Exception as e:  # a bug must cost one 500, never the slot: an unfilled slot blocks the connection
            self.fail(slot, e, request.keep_alive)

    def _reserve_small(self, declared: int) -> bool:
        """Take a small body's share of the in-flight budget (BodyBudget.take without the call), if it fits."""
        budget = self.app.body_budget
        if self._reserved or budget.used + declared > budget.limit:
            return False
        budget.used += declared
        self._reserved = declared
        return True

    def _check_declared_length(self, length: int) -> None:
        """Refuse a body by its Content-Length, before reading it: too large, too large for the model, or
        more than the in-flight budget has left."""
        limit = self._limits.max_body_bytes
        if length > limit:
            raise Reject(413, f"request body of {length} bytes is larger than the limit of {limit} bytes")
        if length > _BOUND_CHECK_BYTES:
            bound = self.app.body_bound(self._url)
            if bound is not None and length > bound[1]:
                raise Reject(413, f"request body of {length} bytes is larger than model {bound[0]!r} can take: "
                                   f"its inputs at their largest need at most {bound[1]} bytes")
            self._reserve(length)
            self._buffer = bytearray()  # not bytearray(length): zeroing it all would stall the loop
            return
        self._reserve(length)

    def _reserve(self, total: int) -> None:
        budget = self.app.body_budget
        if not budget.take(total - self._reserved):
            raise Reject(503, f"the server holds {budget.used} bytes of request bodies, its limit "
                               f"(server.max_inflight_body_bytes) is {budget.limit}: {total} more do not fit; "
                               "retry later", RETRY)
        self._reserved = total

    def _release_reserved(self) -> None:
        if self._reserved:
            self.app.body_budget.release(self._reserved)
            self._reserved = 0

    def _refuse_over_limit(self, transport: asyncio.Transport) -> None:
        app = self.app
        self._closing = self._refused = True
        app.refused_connections += 1
        if app.refused_connections & (app.refused_connections - 1) == 0:  # 1, 2, 4, 8...: a flood logs little
            log.warning("%d connections refused since start: server.max_connections (%d) are open",
                        app.refused_connections, app.max_connections)
        refused = app.refused
        if len(refused) >= app.connection_limit.lingering:
            # The descriptors for lingering are spent: close the oldest, which had the longest to read its
            # answer (and whose input was read), rather than this one, which would be reset unanswered.
            oldest = next(iter(refused))
            del refused[oldest]
            oldest.close_now()
        refused[self] = None
        transport.write(over_limit_response(app.max_connections))
        self._close_gracefully()

    def _headers_too_large(self) -> Reject:
        return Reject(431, f"request line and headers are larger than the limit of {self._max_header_bytes} "
                            "bytes")

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
                done.pending.clear()
            transport.write(done.data)  # type: ignore[arg-type]
            if done.close:
                self._close_after_write()
                return
        if slots and slots[0].pending and transport is not None:
            transport.write(b"".join(slots[0].pending))  # a stream that is now first in line
            slots[0].pending.clear()
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


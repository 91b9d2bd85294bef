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

A read that repeats the connection's last request head byte for byte, followed by exactly its body, is that
request again and skips the parser (`edged.serving._repeat` says why that is safe); every other read is parsed.
The write half (response order, back-pressure, the lingering close) is `edged.serving._responder`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import TYPE_CHECKING

import httptools

from edged.protocol.shm_params import ShmReader
from edged.serving._access import peer_of
from edged.serving._api_key import API_ACTION, ApiKey
from edged.serving._body_reader import LARGE_BODY_BYTES, BodyReader, LargeBody
from edged.serving._content_coding import check_transfer_coding, content_coding, decode_body
from edged.serving._limits import RETRY, over_limit_response
from edged.serving._messages import WANTED_HEADERS, Incoming, Reject, Slot, header_int
from edged.serving._openai import INVALID_API_KEY, WWW_AUTHENTICATE, Unauthenticated
from edged.serving._repeat import Repeat, learn
from edged.serving._responder import LINGER_S, MAX_PIPELINED, Responder
from edged.serving._routes import is_openai_url

if TYPE_CHECKING:
    from edged.serving._app import App

# Slot, Incoming and header_int live in _messages; the front ends import them from here as well.
__all__ = ["LINGER_S", "MAX_PIPELINED", "WANTED_HEADERS", "Connection", "Incoming", "Slot", "header_int"]

log = logging.getLogger(__name__)

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# Bodies declared larger than this are checked against the largest body the target model can take before a
# byte of them is read; smaller ones cost too little to be worth the lookup.
_BOUND_CHECK_BYTES = 1024 * 1024


class Connection(Responder, asyncio.Protocol):
    def __init__(self, app: App, kind: str) -> None:
        super().__init__(app, kind)
        self.shm_reader: ShmReader | None = None  # reads shared memory as this peer (set by the infer path)
        self.last_activity = 0.0
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._header_bytes = 0
        # A body the parser delivers: its one piece as it came (the common case, no copy), or, from its second
        # piece on, one buffer grown in place (_add_piece).
        self._body: bytes | bytearray = b""
        # A large body declared by Content-Length is read into one buffer, after its head's read by the
        # transport itself (see _body_reader): joining its chunks would copy it all on the loop (170 ms for 53 MB).
        self._large: LargeBody | None = None
        self._body_bytes = 0
        self._coding: int | None = None  # the request's Content-Encoding as zlib window bits (_content_coding)
        self._refused = False  # accepted past max_connections, answered 503, lingering until closed
        self._limits = app.limits
        self._max_header_bytes = app.limits.max_header_bytes
        # bodies up to this size are within every limit but the in-flight budget (see _check_declared_length)
        self._small_body = min(LARGE_BODY_BYTES - 1, app.limits.max_body_bytes)
        self._wanted_headers = app.wanted_headers  # WANTED_HEADERS and those access control reads
        self._wanted_lengths = app.wanted_lengths
        self._api_key = app.api_key  # required of /v1 requests over TCP when set (checked from the head)
        self.feeding = False  # inside data_received: requests it completes are flushed when it returns
        self._repeat: Repeat | None = None  # the last head that can be replayed without the parser (_repeat)
        self._in_message = False  # the parser has begun a request it has not completed
        self._head_alone = False  # a read held exactly the repeated head; its body is still to come
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
        self._closing = True
        if self._linger is not None:
            self._linger.cancel()
        if self._gone_check is not None:
            self._gone_check.cancel()
        self._release_reserved()
        self.cancel_owed(exc)
        if self._refused:
            self.app.refused.pop(self, None)
            return
        self.app.connections.discard(self)

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
                return
        self._feed(data)

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
            if self._large is not None and self._transport is not None and not self._closing:
                self._transport.set_protocol(BodyReader(self, self._large))  # the body's rest, past the parser
        except httptools.HttpParserUpgrade:
            self.reject(400, "protocol upgrades (Upgrade, CONNECT) are not supported")
        except httptools.HttpParserCallbackError as e:
            cause = e.__context__
            if isinstance(cause, Reject):
                self.reject(cause.status, str(cause), cause.headers, cause.code)
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
        return self.half_closed()  # a FIN is not a hang-up (see _responder)

    # --- parser callbacks ----------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.request_started = self.last_activity  # the loop time of this data_received call
        self._in_message = True
        self._begins += 1
        self._url = b""
        self._headers = {}
        self._header_bytes = 0
        self._body = b""
        self._large = None
        self._body_bytes = 0
        self._coding = None

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
        if version == "1.0":
            self.interim_allowed = False
        headers = self._headers
        key = self._api_key
        if key is not None and self.kind == "tcp" and is_openai_url(self._url):
            self._check_key(key, headers)
        if not headers:
            return
        coding = headers.get(b"content-encoding")
        if coding is not None:
            self._coding = content_coding(coding)
        framing = headers.get(b"transfer-encoding")
        if framing is not None:
            check_transfer_coding(framing)
        length = headers.get(b"content-length")
        if length is not None and length.isdigit():
            declared = int(length)
            if declared > self._small_body or not self._reserve_small(declared):
                self._check_declared_length(declared)
        if headers.get(b"expect", b"").lower() == b"100-continue" and not self._slots and self._transport:
            self._transport.write(_CONTINUE)

    def _check_key(self, key: ApiKey, headers: dict[bytes, bytes]) -> None:
        """The API key a /v1 request over TCP needs, checked from its head: a client without it gets its 401
        before a byte of its body is read or reserved (and no ``100 Continue`` inviting one)."""
        try:
            key.check(headers)
        except Unauthenticated as e:
            self.app.count_denied(API_ACTION)
            raise Reject(401, str(e), WWW_AUTHENTICATE, INVALID_API_KEY) from None

    def openai_request(self) -> bool:
        return is_openai_url(self._url)

    def on_body(self, body: bytes) -> None:
        if self._large is not None:
            self._large.add(body)  # its length was checked and reserved before its first byte
            return
        self._body_bytes += len(body)
        if self._body_bytes > self._limits.max_body_bytes:
            self._drop_body()
            raise Reject(413, f"request body is larger than the limit of {self._limits.max_body_bytes} bytes")
        if self._body_bytes > self._reserved:  # a chunked body, or one longer than declared
            try:
                self._reserve(self._body_bytes)
            except Reject:
                self._drop_body()
                raise
        if self._body:
            self._add_piece(body)
        else:
            self._body = body

    def _add_piece(self, piece: bytes) -> None:
        """Grow the body by a piece in one buffer. A chunked body comes in hundreds of parser pieces: kept apart
        and joined, they are thousands of heap blocks that glibc could not give back once freed (each 70 MB body
        left RSS ~60 MiB higher, for good); one buffer is one block, mapped on its own once it is large."""
        body = self._body
        if isinstance(body, bytearray):
            body += piece
        else:
            grown = bytearray(body)
            grown += piece
            self._body = grown

    def _drop_body(self) -> None:
        """Free a refused body now, not when the connection goes (it lingers up to LINGER_S after the answer)."""
        self._body = b""

    def on_message_complete(self) -> None:
        self.request_started = 0.0
        self._in_message = False
        if self._closing:
            self._release_reserved()
            return  # pipelined behind a response that closes the connection: the client must resend it
        body: bytes | bytearray
        if self._large is not None:
            body, self._large = self._large.buffer, None
        else:
            body, self._body = self._body, b""
        coding = self._coding
        if coding is not None:
            try:
                body = self._decoded(body, coding)
            except Reject as e:
                self.reject(e.status, str(e), e.headers, e.code)
                return
        method = self._parser.get_method()
        keep_alive = self._parser.should_keep_alive()
        if self._begins == 1 and len(body) <= self._small_body:
            self._learnable = (method, self._url, self._headers, body, keep_alive)
        self._complete(method, self._url, self._headers, body, keep_alive)

    def _decoded(self, body: bytes | bytearray, coding: int) -> bytearray:
        """A Content-Encoding body decoded (at most max_body_bytes of it) and charged to the in-flight budget.
        On the loop, like the parse of a body that size: a coded body is rare, and what decompresses costs less
        than what reads it."""
        decoded = decode_body(body, coding, self._limits.max_body_bytes)
        if len(decoded) > self._reserved:
            self._reserve(len(decoded))
        return decoded

    def _complete(self, method: bytes, url: bytes, headers: dict[bytes, bytes], body: bytes | bytearray,
                  keep_alive: bool) -> None:
        """Hand a whole request to the dispatcher, in a slot of its own."""
        request = Incoming(method, url, headers, body, keep_alive, self._reserved)  # also its slot
        self._reserved = 0
        self._slots.append(request)
        self.app.active += 1
        if len(self._slots) > MAX_PIPELINED:
            self._update_reading()
        try:
            self.app.dispatch(self, request, request)
        except Exception as e:  # a bug must cost one 500, never the slot: an unfilled slot blocks the connection
            self.fail(request, e, keep_alive)

    def large_body_read(self) -> None:
        """The BodyReader filled the body, or the connection is closing: the request completes as if the
        parser had read it, and a fresh parser reads what follows (the old one is mid-body)."""
        if self._transport is not None:
            self._transport.set_protocol(self)
        self.feeding = True
        try:
            self.on_message_complete()  # the old parser still knows the method and keep-alive
        finally:
            self.feeding = False
            self._parser = httptools.HttpRequestParser(self)
            self._large = None
        self.app.end_of_input(self)

    @property
    def closing(self) -> bool:
        return self._closing

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
        if length >= LARGE_BODY_BYTES:
            self._large = LargeBody(length)

    def _reserve(self, total: int) -> None:
        budget = self.app.body_budget
        if not budget.take(total - self._reserved):
            raise Reject(503, f"the server holds {budget.used} bytes of request bodies, its limit "
                               f"(server.max_inflight_body_bytes) is {budget.limit}: {total} more do not fit; "
                               "retry later", RETRY)
        self._reserved = total

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

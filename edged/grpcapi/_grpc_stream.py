"""One gRPC call on one HTTP/2 stream (the gRPC project's doc/PROTOCOL-HTTP2.md): request headers checked,
length-prefixed messages cut out of the stream's DATA, the response written as HEADERS, DATA and trailers.

Invariants:
- A call ends exactly once (``done``): with trailers after its responses, trailers-only for an error before
  any response, or silently when the client reset the stream. Anything that finishes later (the engine's
  callback for a deadline-expired or cancelled call) is dropped.
- A message's length prefix is judged before its bytes are buffered: past ``[server] grpc_max_message_mb`` the
  call ends with RESOURCE_EXHAUSTED at once (a 4 GB prefix costs nothing); a compressed message (flag 1)
  ends it with UNIMPLEMENTED and ``grpc-accept-encoding: identity``, as gRPC's compression spec asks of an
  encoding the server does not offer (INTERNAL when the call declares no encoding: the client's own error).
- Bytes of a request message still arriving are charged as they arrive to the in-flight body budget the daemon
  shares between its front ends (``[server] max_inflight_body_bytes``) and released once the message is whole
  or the call ends: bytes that do not fit end the call with RESOURCE_EXHAUSTED (a prefix larger than the whole
  budget at once), so many streams each sending part of a large message hold at most that budget together,
  and a prefix claiming a large message that never comes holds none of it. A unary call's whole
  message waiting for the client's half-close stays charged (``_kept``: one that arrived in one frame is
  charged then, and refused the same way) until it is handed to the handler on the half-close, or the call
  ends, whichever comes first: the charge is released once. Bytes a held call
  keeps unparsed (a ModelStreamInfer at its bound) are charged too, as they arrive, and released once taken
  or when the call ends; past the budget the call ends with RESOURCE_EXHAUSTED, so no client parks memory
  outside it.
- A message whose bytes stop arriving ends its call with DEADLINE_EXCEEDED ``[server] request_timeout_s`` after
  its prefix, as does a unary call not half-closed that long after it opened (the server's sweeper calls
  ``expire``): a status and message every gRPC client shows, where an
  RST_STREAM would read as a bare CANCELLED or INTERNAL.
- An answer, or a new call, is refused with RESOURCE_EXHAUSTED while the connection's unsent answers are at
  ``[server] grpc_max_unsent_mb`` (``unread_answers``): a client that does not read is not kept in memory.
- ``grpc-timeout`` becomes a deadline on the loop's clock: past it the call ends with DEADLINE_EXCEEDED and
  its work is cancelled.
- Malformed request headers (RFC 9113 §8.2-8.3: uppercase names, names with blanks, controls, ':' or non-ASCII,
  values with CR, LF, NUL or blanks at either end, connection-specific fields, a ``te`` other than ``trailers``,
  pseudo-headers missing, unknown or after regular ones, DATA adding up to other than a ``content-length``)
  reset the stream (PROTOCOL_ERROR);
  a request that is well-formed HTTP/2 but not gRPC gets an HTTP status (405, 415) as the protocol asks.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edged.access import BodyBudget
from edged.engine import Cancellation
from edged.errors import AnswersUnread, EdgedError
from edged.grpcapi import _hpack as hpack
from edged.grpcapi._h2_frames import ErrorCode, H2StreamError
from edged.grpcapi._h2_inflow import STREAM_WINDOW
from edged.grpcapi._status import Status, code_for

if TYPE_CHECKING:
    from edged.grpcapi._h2_connection import H2Connection

_HEAD = hpack.STATUS_200 + hpack.CONTENT_TYPE_GRPC
_OK = hpack.literal(b"grpc-status", b"0")
_ACCEPT_ENCODING = hpack.literal(b"grpc-accept-encoding", b"identity")  # the only message encoding edged reads
_PSEUDO = frozenset({b":method", b":scheme", b":path", b":authority"})
# RFC 9113 8.2.1: what makes a field malformed (uppercase is refused by its own check, with its own words)
_NAME = re.compile(rb"[\x21-\x39\x3b-\x7e]+")
_BAD_VALUE = re.compile(rb"[\x00\r\n]")
_BLANK = (b" ", b"\t")
_CONNECTION_SPECIFIC = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
                                  b"upgrade"})
_TIMEOUT_UNITS = {ord("H"): 3600.0, ord("M"): 60.0, ord("S"): 1.0, ord("m"): 1e-3, ord("u"): 1e-6, ord("n"): 1e-9}
_UNRESERVED = frozenset(range(0x20, 0x7F)) - {ord("%")}
_HEADS = 64
# An error text's length in grpc-message: it names what was wrong, and what it quotes of the request is the
# client's own, of any length; percent-encoded, ASCII text stays within 3 KiB, well inside the 8 KiB header
# list gRPC clients accept by default.
STATUS_MESSAGE_CHARS = 1024
# One stream's unsent answers, at most: what its receive window lets a client send it holds of answers too, so
# a ModelStreamInfer's requests taken before it stopped reading leave at most this much waiting.
STREAM_UNSENT = STREAM_WINDOW
_HEAD_BYTES = 2048


@dataclass(frozen=True)
class CallLimits:
    message_bytes: int  # [server] grpc_max_message_mb
    budget: BodyBudget  # [server] max_inflight_body_bytes, shared with the HTTP server
    request_timeout_s: float  # [server] request_timeout_s: a message's bytes must all arrive within it


class Request:
    """A request's headers as the handlers need them."""

    __slots__ = ("content_length", "encoding", "metadata", "path", "timeout_s")

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        pseudo: dict[bytes, bytes] = {}
        metadata: dict[bytes, bytes] = {}
        for name, value in headers:
            if _BAD_VALUE.search(value) or value[:1] in _BLANK or value[-1:] in _BLANK:
                raise ValueError(f"header {name!r}: a value with CR, LF, NUL or a leading or trailing blank")
            if name[:1] == b":":
                if metadata or name not in _PSEUDO or name in pseudo:
                    raise ValueError(f"pseudo-header {name!r} unknown, repeated or after a regular header")
                pseudo[name] = value
            elif name.lower() != name or name in _CONNECTION_SPECIFIC:
                raise ValueError(f"header {name!r} is uppercase or connection-specific")
            elif not _NAME.fullmatch(name):
                raise ValueError(f"header name {name!r} is empty or holds a blank, a control character, ':' or "
                                 "a byte past ASCII")
            elif name == b"te" and value != b"trailers":
                raise ValueError(f"te {value!r} (only 'trailers' is allowed)")
            elif name == b"content-length" and (not value.isdigit() or b"content-length" in metadata):
                raise ValueError(f"content-length {value!r} is not one number of bytes")
            else:
                metadata[name] = value
        if b":method" not in pseudo or b":path" not in pseudo or b":scheme" not in pseudo:
            raise ValueError("a request without :method, :scheme or :path")
        self.path = pseudo[b":path"]
        self.metadata = metadata
        self.timeout_s = parse_timeout(metadata.get(b"grpc-timeout"))
        self.encoding = metadata.get(b"grpc-encoding", b"identity")
        length = metadata.get(b"content-length")  # gRPC clients send none; HTTP/2 holds the DATA to it if given
        self.content_length = None if length is None else int(length)
        if pseudo[b":method"] != b"POST":
            raise _HttpRefusal(b"405", f"method {pseudo[b':method']!r}: gRPC calls are POST")
        content_type = metadata.get(b"content-type", b"")
        if content_type != b"application/grpc" and not content_type.startswith((b"application/grpc+",
                                                                                   b"application/grpc;")):
            raise _HttpRefusal(b"415", f"content-type {content_type!r}: gRPC calls are application/grpc")


class RequestHeads:
    """Request headers → `Request`, kept for a header list seen before: a channel sends the same list for every
    call of one method. The key is the decoded list itself (whatever HPACK's table held), so calls share a
    `Request` (read-only) only when their headers are equal; a list that is refused is parsed again every time,
    one over ``_HEAD_BYTES`` is not kept, and at ``_HEADS`` lists the cache is emptied."""

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[tuple[tuple[bytes, bytes], ...], Request] = {}

    def parse(self, headers: list[tuple[bytes, bytes]]) -> Request:
        key = tuple(headers)
        request = self._cache.get(key)
        if request is None:
            request = Request(headers)
            if sum(len(name) + len(value) for name, value in key) <= _HEAD_BYTES:
                if len(self._cache) >= _HEADS:
                    self._cache.clear()
                self._cache[key] = request
        return request


class _HttpRefusal(Exception):
    def __init__(self, status: bytes, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_timeout(value: bytes | None) -> float | None:
    """``grpc-timeout``: 1 to 8 digits and a unit (H M S m u n), as seconds."""
    if value is None:
        return None
    if not 2 <= len(value) <= 9 or not value[:-1].isdigit() or value[-1] not in _TIMEOUT_UNITS:
        raise ValueError(f"grpc-timeout {value!r} is not 1-8 digits and a unit of H, M, S, m, u or n")
    return int(value[:-1]) * _TIMEOUT_UNITS[value[-1]]


def status_block(code: Status, message: str, head: bool) -> bytes:
    """Trailers (or, with ``head``, a trailers-only response) carrying ``code`` and a percent-encoded message,
    cut to ``STATUS_MESSAGE_CHARS``: errors quote what the client sent (a method, a model name), and a header
    block must stay within what any peer's SETTINGS_MAX_HEADER_LIST_SIZE takes."""
    message = bounded(message)
    encoded = "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in message.encode()).encode("ascii")
    block = hpack.literal(b"grpc-status", str(int(code)).encode()) + hpack.literal(b"grpc-message", encoded)
    return _HEAD + block if head else block


def bounded(message: str) -> str:
    """``message`` cut to ``STATUS_MESSAGE_CHARS``, saying so."""
    if len(message) <= STATUS_MESSAGE_CHARS:
        return message
    return f"{message[:STATUS_MESSAGE_CHARS]}... ({len(message)} characters, cut)"


class GrpcCall:
    """The call side of one stream; ``on_message`` and ``on_end`` are set by the handler that serves it."""

    __slots__ = ("_buffer", "_conn", "_deadline", "_deadline_at", "_end_seen", "_held", "_held_charge", "_input_over",
                 "_kept", "_length_left", "_limits", "_open_since", "_parks", "_partial_since", "_reserved", "_started",
                 "cancellation", "done", "on_cancel", "on_drained", "on_end", "on_message", "output", "request",
                 "sender", "stream_id", "tally", "task")

    def __init__(self, conn: H2Connection, stream_id: int, request: Request, limits: CallLimits,
                 tally: dict[Status, int]) -> None:
        self._conn = conn
        self.sender: object = conn  # tells concurrent clients apart (GrpcInfer.begin gathers their requests)
        self.output = conn.output  # its ``unsent``: 0 (the usual case) needs no ``unread_answers`` call
        self.tally = tally  # how calls of this RPC ended, by status (``GrpcMetrics.calls``): counted in _finish
        self.stream_id = stream_id
        self.request = request
        self._limits = limits
        self._reserved = 0  # budget bytes held for the message being received
        self._parks = False  # a unary call: its handler keeps a whole message until the half-close
        self._kept = 0  # budget bytes held for whole messages kept so, until the half-close or the end
        self._partial_since: float | None = None  # when the prefix of the message being received arrived
        self._held = False  # the handler takes no request messages for now
        self._held_charge = 0  # budget bytes held for input kept unparsed while held
        self._open_since: float | None = None  # a unary call's start, until the client half-closes
        self._end_seen = False  # the client half-closed (maybe while held: acted on when resumed)
        self._input_over = False  # on_end has run: no more input to hold or resume
        self._buffer = bytearray()
        self._length_left = request.content_length  # DATA bytes the request's content-length still announces
        self.done = False
        # set when the call ends other than OK (reset, deadline, failure): its requests still queued are not run
        self.cancellation = Cancellation()
        self._started = False  # response headers sent
        self.task: asyncio.Task[None] | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self.on_message: Callable[[bytes], None] = _nothing
        self.on_end: Callable[[], None] = _none
        self.on_cancel: Callable[[], None] = _none
        self.on_drained: Callable[[], None] = _none
        self._deadline_at = 0.0  # the loop time the deadline passes (uvloop's timer handles have no when())
        if request.timeout_s is not None:
            loop = asyncio.get_running_loop()
            # below the loop clock's millisecond (uvloop's time() is read once per turn) a deadline counts as passed:
            # no answer could come sooner
            self._deadline_at = loop.time() + (request.timeout_s if request.timeout_s >= 1e-3 else 0.0)
            self._deadline = loop.call_later(request.timeout_s, self._expired)

    # --- from the connection --------------------------------------------------------------------------------
    def data(self, chunk: memoryview, end_stream: bool) -> None:
        if self.done or (self._length_left is not None and self._malformed_length(len(chunk), end_stream)):
            return
        deadline = self._deadline
        if deadline is not None and self._deadline_at <= asyncio.get_running_loop().time():
            # passed before this DATA was read (grpc-timeout 0S, 1n): its timer would fire only after the message,
            # read in the same turn, had been handed to the engine and run
            deadline.cancel()
            self._expired()
            return
        if end_stream:
            self._end_seen = True
            self._open_since = None
        buffer = self._buffer
        size = len(chunk)
        if (not buffer and not self._held and size >= 5 and not chunk[0]
                and size - 5 == int.from_bytes(chunk[1:5], "big") <= self._limits.message_bytes):
            # the usual unary DATA frame: one whole uncompressed message within the limit, nothing buffered
            # before it; what _cut would do, without copying the frame into the buffer and out again
            if self._parks and not end_stream and not self._keep(size - 5):
                return
            self.on_message(bytes(chunk[5:]))
        else:
            if size:
                buffer += chunk
            if self._held:
                self._charge_held()  # kept, unparsed, until the handler takes input again; the windows bound it
                return
            pos = self._cut(buffer)
            if self.done:
                return
            if pos:
                del buffer[:pos]  # once per DATA frame, not per message: a held stream's backlog is cut in one pass
        if self.done:
            return
        if self._held:
            self._charge_held()  # the rest of these frames, kept from now on
            return
        if self._end_seen and not self._held and not self._input_over:
            self._input_over = True
            if buffer:
                self.fail(Status.INTERNAL, f"the request ended inside a message ({len(buffer)} bytes of it)")
                return
            if self._kept:  # the handler takes its message now: decoded and submitted before anything else runs
                self._release_kept()
            self.on_end()

    def _cut(self, buffer: bytearray) -> int:
        """Hand the whole messages in ``buffer`` to ``on_message`` while the handler takes them; the bytes used."""
        pos = 0
        while len(buffer) - pos >= 5 and not self._held:
            length = int.from_bytes(buffer[pos + 1:pos + 5], "big")
            if buffer[pos]:
                encoding = self.request.encoding
                if encoding == b"identity":  # flag 1 with no encoding to decode it by: the client is wrong
                    self.fail(Status.INTERNAL, "a message with the compressed flag set on a call that declares no "
                              "compression (grpc-encoding identity or absent): send it with the flag 0")
                else:  # gRPC's compression spec: UNIMPLEMENTED, naming the encodings the server accepts
                    self.fail(Status.UNIMPLEMENTED, f"compressed messages (grpc-encoding "
                              f"{encoding.decode('latin-1')!r}) are not supported: send identity",
                              _ACCEPT_ENCODING)
                return pos
            if length > self._limits.message_bytes:
                self.fail(Status.RESOURCE_EXHAUSTED, f"a message of {length} bytes, more than the limit of "
                          f"{self._limits.message_bytes} bytes ([server] grpc_max_message_mb)")
                return pos
            if len(buffer) - pos < 5 + length:
                # charged as its bytes arrive, not from its prefix: a claim of a large message that never comes
                # holds none of the budget other calls need
                arrived = len(buffer) - pos - 5
                if arrived > self._reserved or self._partial_since is None:
                    self._reserve(arrived, length)
                return pos
            message = bytes(buffer[pos + 5:pos + 5 + length])
            pos += 5 + length
            if self._parks and not self._end_seen:
                if not self._keep(length):
                    return pos
            elif self._reserved or self._partial_since is not None:
                self._release()
            self.on_message(message)
            if self.done:
                return pos
        return pos

    def _malformed_length(self, size: int, end_stream: bool) -> bool:
        """RFC 9113 §8.1.1: DATA adding up to other than the request's content-length make it malformed; the
        stream is reset (PROTOCOL_ERROR) and the call cancelled. True once it is."""
        left = self._length_left = (self._length_left or 0) - size
        if left >= 0 and not (end_stream and left):
            return False
        self._conn.reset(self.stream_id, ErrorCode.PROTOCOL_ERROR)
        self.cancel()
        return True

    def hold_input(self, held: bool) -> None:
        """Stop (``held``) or resume taking request messages: the handler's back-pressure on a streaming call.
        While held, DATA is kept unparsed and the connection grants the client no window for it."""
        if self.done or held == self._held or self._input_over:
            return
        self._held = held
        self._conn.hold(self.stream_id, held)
        if not held:
            self._release_held()  # what is cut now is the handler's; a partial message reserves as usual
            if self._partial_since is not None:  # its sender was stalled by us, not by itself
                self._partial_since = self._conn.now()
            self.data(memoryview(b""), self._end_seen)

    def unread_answers(self, what: str) -> AnswersUnread | None:
        """The refusal of ``what`` (an answer, a new call) while this connection's unsent answers are at
        ``[server] grpc_max_unsent_mb``, or this stream's at its share (``STREAM_UNSENT``), else None: below
        them an answer of any size is kept, so what a client that never reads makes edged hold is the bound plus
        one answer per connection."""
        conn = self._conn
        limit, held, where = conn.unsent_limit, conn.output.unsent, "this connection"
        if held < limit:
            limit, held, where = min(limit, STREAM_UNSENT), conn.unsent_of(self.stream_id), "this stream"
            if held < limit:
                return None
        return AnswersUnread(f"{what} is refused: {held} bytes of answers on {where} wait for the client to read "
                             f"them, at the limit of {limit} bytes ([server] grpc_max_unsent_mb, a stream at most "
                             f"{STREAM_UNSENT >> 20} MiB of it); read the answers (open the flow-control window), "
                             "then retry")

    @property
    def output_waiting(self) -> bool:
        return self._conn.output_waiting(self.stream_id)

    def drained(self) -> None:
        """The connection sent all of this call's pending response bytes."""
        if not self.done:
            self.on_drained()

    def _reserve(self, arrived: int, length: int) -> bool:
        """Hold ``arrived`` bytes of the budget (in all) for a message of ``length`` bytes that is arriving; False
        once the call is failed. A message larger than the whole budget is refused at its prefix."""
        budget = self._limits.budget
        if length > budget.limit or not budget.take(arrived - self._reserved):
            self.fail(Status.RESOURCE_EXHAUSTED, f"a message of {length} bytes does not fit: request messages and "
                      f"bodies held at once are limited to {budget.limit} bytes ([server] max_inflight_body_bytes) "
                      f"and {budget.used} are held; retry later")
            return False
        self._reserved = arrived
        if self._partial_since is None:
            self._partial_since = self._conn.now()
        return True

    def _keep(self, length: int) -> bool:
        """Charge a whole message of ``length`` bytes that waits for the half-close (what was charged as its
        pieces arrived carries over); False once the call is failed, as a reservation that does not fit."""
        if self._reserved < length and not self._reserve(length, length):
            return False
        self._kept += self._reserved
        self._reserved = 0
        self._partial_since = None  # whole: what is still to come is the half-close (``_open_since``)
        return True

    def _release_kept(self) -> None:
        self._limits.budget.release(self._kept)
        self._kept = 0

    def _charge_held(self) -> None:
        """Charge the bytes kept unparsed beyond what the message being received has charged."""
        covered = 5 + self._reserved if self._reserved else 0
        held = max(0, len(self._buffer) - covered)
        more = held - self._held_charge
        budget = self._limits.budget
        if more > 0 and not budget.take(more):
            self.fail(Status.RESOURCE_EXHAUSTED, f"{held} bytes of requests held unread on this stream do not "
                      f"fit: request messages and bodies held at once are limited to {budget.limit} bytes "
                      f"([server] max_inflight_body_bytes) and {budget.used} are held; retry later")
            return
        if more < 0:
            budget.release(-more)
        self._held_charge = held

    def _release_held(self) -> None:
        if self._held_charge:
            self._limits.budget.release(self._held_charge)
            self._held_charge = 0

    def _release(self) -> None:
        self._limits.budget.release(self._reserved)
        self._reserved = 0
        self._partial_since = None

    def expect_whole_request(self) -> None:
        """A unary call: its request (message and half-close) must all arrive within ``request_timeout_s``,
        as an HTTP request must, so a stream opened and left silent does not hold its slot for ever; and its
        message, kept by the handler until the half-close, stays charged to the budget until then."""
        self._parks = True
        if not self._end_seen:
            self._open_since = self._conn.now()

    def expire(self, now: float) -> None:
        """End the call if its request has been arriving for longer than ``[server] request_timeout_s``."""
        since = self._partial_since if self._partial_since is not None else self._open_since
        timeout = self._limits.request_timeout_s
        if since is not None and not self.done and not self._held and now - since > timeout:
            self.fail(Status.DEADLINE_EXCEEDED, f"the request did not arrive completely within {timeout:g} s "
                      "([server] request_timeout_s)")

    def cancel(self) -> None:
        """The client reset the stream (or the connection went): stop the work, answer nothing."""
        if self.done:
            return
        on_cancel = self.on_cancel  # _finish lets go of the handler's callbacks
        self._finish(Status.CANCELLED)
        on_cancel()
        if self.task is not None:
            self.task.cancel()

    # --- from the handler -----------------------------------------------------------------------------------
    def reply(self, message: bytes) -> None:
        """The one response of a unary call, and OK: one write."""
        if self.done:
            return
        if (unread := self.unread_answers(f"an answer of {len(message)} bytes")) is not None:
            self.fail(Status.RESOURCE_EXHAUSTED, str(unread))
            return
        self._finish(Status.OK)
        self._conn.respond_message(self.stream_id, _HEAD, message, _OK)

    def answer(self, answer: bytes | EdgedError) -> None:
        """A unary call's end: its serialised response, or the error that stands for it."""
        if isinstance(answer, bytes):
            if self.done:
                return
            conn = self._conn
            if conn.output.unsent:  # as reply, without its call while nothing waits
                self.reply(answer)
                return
            self._finish(Status.OK)
            conn.respond_message(self.stream_id, _HEAD, answer, _OK)
        else:
            self.fail(code_for(answer), str(answer))

    def send(self, message: bytes, lead: bytes = b"", tail: bytes = b"") -> None:
        """One response of a streaming call: ``lead``, ``message`` and ``tail`` as one message (a wrapper's tag and
        length before the bytes it wraps, and fields after them, framed in one join rather than copied twice)."""
        if self.done:
            return
        head = None if self._started else _HEAD
        self._started = True
        size = len(lead) + len(message) + len(tail)
        self._conn.respond(self.stream_id, head,
                           b"".join((b"\x00", size.to_bytes(4, "big"), lead, message, tail)), None)

    def close(self) -> None:
        """End a streaming call with OK."""
        if self.done:
            return
        self._finish(Status.OK)
        if self._started:
            self._conn.respond(self.stream_id, None, b"", _OK)
        else:
            self._conn.trailers_only(self.stream_id, _HEAD + _OK)

    def fail(self, code: Status, message: str, fields: bytes = b"") -> None:
        """End the call with ``code``; ``fields``: more trailer fields, HPACK-encoded."""
        if self.done:
            return
        self._finish(code)
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()
        if self._started:
            self._conn.respond(self.stream_id, None, b"", status_block(code, message, head=False) + fields)
        else:
            self._conn.trailers_only(self.stream_id, status_block(code, message, head=True) + fields)

    def _finish(self, code: Status) -> None:
        self.done = True
        if code is not Status.OK:
            self.cancellation.cancelled = True
        tally = self.tally
        tally[code] = tally.get(code, 0) + 1
        if self._reserved:
            self._release()
        if self._held_charge:
            self._release_held()
        if self._kept:
            self._release_kept()
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        # The handler's callbacks close over this call: dropped now, the cycle does not keep a parked message
        # (up to grpc_max_message_mb) alive until the garbage collector runs.
        self.on_message = _nothing
        self.on_end = self.on_cancel = self.on_drained = _none

    def _expired(self) -> None:
        self._deadline = None
        self.fail(Status.DEADLINE_EXCEEDED, f"the call's deadline ({self.request.timeout_s:g} s) passed")


def open_call(conn: H2Connection, stream_id: int, headers: list[tuple[bytes, bytes]], limits: CallLimits,
              tally: dict[Status, int], heads: RequestHeads) -> GrpcCall | None:
    """A call for a new stream, or None once the stream has been refused (malformed or not gRPC)."""
    try:
        request = heads.parse(headers)
    except _HttpRefusal as e:
        # a 405 names the method that is allowed (RFC 9110 requires Allow); static index 22 is allow
        allow = hpack.literal_static_name(22, b"POST") if e.status == b"405" else b""
        conn.trailers_only(stream_id, _http_status(e.status) + allow)
        return None
    except ValueError as e:
        raise H2StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, str(e)) from e
    return GrpcCall(conn, stream_id, request, limits, tally)


def _http_status(status: bytes) -> bytes:
    return hpack.literal_static_name(8, status)  # :status


def _nothing(message: bytes) -> None:
    pass


def _none() -> None:
    pass

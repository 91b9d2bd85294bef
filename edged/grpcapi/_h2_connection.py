"""One HTTP/2 connection (RFC 9113, server side, prior knowledge over cleartext): an asyncio Protocol.

This module is the hot half (bytes to frames, streams opened, fed and answered); the cold half it inherits,
with the connection's state, is ``_h2_control`` (the peer's control frames, flood guards, GOAWAY, sweeping).

Invariants:
- Frames are parsed in place from the bytes received (``struct.unpack_from`` and memoryview slices); a partial
  frame waits in one buffer until the bytes it needs have arrived.
- A protocol violation of the connection ends it with one GOAWAY naming the error; one of a stream ends that
  stream with RST_STREAM and the others go on. Nothing the peer sends after a GOAWAY of ours is read.
- Work per frame is bounded: a header block (HEADERS + CONTINUATION) larger than ``MAX_HEADER_BLOCK`` ends the
  connection (CVE-2024-27316), streams beyond MAX_CONCURRENT_STREAMS are refused, resets of streams still owed
  an answer spend a budget that answered streams refill (rapid reset, CVE-2023-44487), and control frames
  answered and streams ended (trailers-only errors, resets) while the peer is not reading are counted until
  ``MAX_UNREAD_CONTROL`` ends the connection (ENHANCE_YOUR_CALM).
- Our DATA never exceeds the peer's windows nor is written while the transport is paused: a response waits in
  its stream until WINDOW_UPDATE or resume_writing (what waits so is bounded: next point); the other frames
  written regardless (headers, trailers, control frames) are bounded by
  ``MAX_STREAMS`` for streams still open and by ``MAX_UNREAD_CONTROL`` for the rest.
- Response DATA held unsent for all streams together (``unsent``) is compared with ``[server]
  grpc_max_unsent_mb`` by the call layer: at the bound a new call or a further answer is refused
  (RESOURCE_EXHAUSTED), so a client that never reads holds at most the bound and one answer; a connection whose
  waiting output does not move for ``request_timeout_s`` is sent GOAWAY ENHANCE_YOUR_CALM and closed (``sweep``).
- A connection that has not sent its preface and SETTINGS within ``PREFACE_TIMEOUT_S`` (or
  ``request_timeout_s``, if shorter) is closed (GOAWAY PROTOCOL_ERROR), so silent connections do not hold slots.
- A connection with no stream open that sends no frame for ``[server] idle_timeout_s`` is sent GOAWAY
  (NO_ERROR) and closed; a call whose message stops arriving is ended by its call (``sweep``, from the
  server's sweeper, on the loop's clock).
- Received DATA is handed to the stream's call as memoryviews valid only during the call (the call copies
  what it keeps); windows are replenished as ``_h2_inflow`` says: a stream's not while its call holds its input
  (``hold``), so a client that writes faster than it is answered waits in that stream's flow control, while
  the connection's window goes on being granted for the other streams.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import cast

from edged.grpcapi import _h2_frames as f
from edged.grpcapi._h2_control import (
    MAX_HEADER_BLOCK,
    MAX_HEADER_LIST,
    MAX_STREAMS,
    OUR_SETTINGS,
    RESET_BUDGET,
    UNSENT_LIMIT,
    H2Control,
    H2Counts,
)
from edged.grpcapi._h2_frames import ErrorCode, H2ConnectionError, H2StreamError
from edged.grpcapi._h2_inflow import CONNECTION_DUE, CONNECTION_WINDOW, STREAM_DUE
from edged.grpcapi._h2_output import Call, H2Stream
from edged.grpcapi._hpack import Decoder, HpackError

# The hot paths' constants and bound methods, looked up once here rather than per frame
_DATA, _HEADERS, _MAX_FRAME = f.DATA, f.HEADERS, f.DEFAULT_FRAME_SIZE
_END_HEADERS, _END_TRAILERS = f.END_HEADERS, f.END_HEADERS | f.END_STREAM
_UNPACK_HEADER, _PACK_HEADER = f.HEADER.unpack_from, f.HEADER.pack
# a DATA frame's header (DATA is type 0) and the gRPC length prefix of its message, in one pack
_PACK_DATA_MESSAGE = struct.Struct(">I B I B I").pack
Opener = Callable[["H2Connection", int, list[tuple[bytes, bytes]], bool], "Call | None"]


class H2Connection(H2Control):
    def __init__(self, opener: Opener, on_close: Callable[[H2Connection], None], counts: H2Counts,
                 refuse: bool = False, unsent_limit: int = UNSENT_LIMIT) -> None:
        super().__init__(counts, unsent_limit)
        self._opener = opener
        self._refuse = refuse  # over [server] max_connections: GOAWAY at once
        self._on_close = on_close
        self._buffer = bytearray()
        self._need = len(f.PREFACE)
        self._need_preface = True
        self._header_block: bytearray | None = None  # a header block waiting for CONTINUATION
        self._header_stream = 0
        self._header_end_stream = False
        self._decoder = Decoder(max_table_size=4096, max_header_list_size=MAX_HEADER_LIST)

    # --- asyncio.Protocol -----------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # a stream server's transport
        if self._dead:  # aborted before it was made: a refused connection past the lingering ones
            self._transport.abort()
            return
        self.now = asyncio.get_running_loop().time
        self._last_frame = self._stalled_since = self._made_at = self.now()
        self._transport.write(f.settings_frame(OUR_SETTINGS) + f.window_update(0, CONNECTION_WINDOW - f.DEFAULT_WINDOW))
        if self._refuse:
            self._shut(ErrorCode.ENHANCE_YOUR_CALM, "too many gRPC connections ([server] max_connections)")

    def connection_lost(self, exc: Exception | None) -> None:
        self._dead = True
        if self._linger is not None:
            self._linger.cancel()
        streams, self._streams = self._streams, {}
        self._blocked = {}
        for stream in streams.values():
            if stream.call is not None:
                stream.call.cancel()
        self._on_close(self)

    def pause_writing(self) -> None:
        self._sender.paused = True

    def resume_writing(self) -> None:
        self._sender.paused = False
        self._sender.progress += 1
        self._unread_control = 0
        if self._blocked:
            self._flush(list(self._blocked.items()))

    def data_received(self, data: bytes) -> None:
        if self._dead:
            return
        self._last_frame = self.now()
        buffer = self._buffer
        if buffer:
            buffer += data
            if len(buffer) < self._need:
                return
            data = bytes(buffer)
            buffer.clear()
        self._cork = []  # what answering these frames writes leaves in one write (one syscall) at the end
        try:
            pos = self._parse(data)
        except H2ConnectionError as e:
            self._uncork()
            errors = self._counts.errors  # here, not in fail: a refused connection's GOAWAY is no peer's error
            errors[e.code] = errors.get(e.code, 0) + 1
            self.fail(e.code, str(e))
            return
        out, self._cork = self._cork, None  # _uncork, inlined: this runs for every read
        transport = self._transport
        if out and transport is not None and not self._dead:
            transport.write(b"".join(out))
        if pos < len(data):
            buffer += data[pos:]

    def eof_received(self) -> bool | None:
        return None  # close our side too: HTTP/2 has no half-closed connection

    # --- parsing --------------------------------------------------------------------------------------------
    def _parse(self, data: bytes) -> int:
        pos = 0
        if self._need_preface:
            if not f.check_preface(data):
                return 0
            self._need_preface = False
            pos = len(f.PREFACE)
        view = memoryview(data)
        size = len(data)
        unpack = _UNPACK_HEADER
        while size - pos >= 9 and not self._dead:
            word, flags, stream_id = unpack(data, pos)
            length = word >> 8
            if length > _MAX_FRAME:
                raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, f"a frame of {length} bytes, more than our "
                                        f"SETTINGS_MAX_FRAME_SIZE {f.DEFAULT_FRAME_SIZE}")
            end = pos + 9 + length
            if end > size:
                self._need = end - pos
                return pos
            kind = word & 0xFF
            stream_id &= 0x7FFFFFFF
            if self._preface:
                if kind != f.SETTINGS or flags & f.ACK:
                    raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "the client's first frame is not SETTINGS")
                self._preface = False
            try:
                if kind > _HEADERS or self._header_block is not None:
                    self._frame(kind, flags, stream_id, view[pos + 9:end])
                elif kind == _DATA:  # DATA and HEADERS as _frame would call them, without its dispatch
                    self._data(flags, stream_id, view[pos + 9:end])
                else:
                    self._headers(flags, stream_id, view[pos + 9:end])
            except H2StreamError as e:
                self.reset(e.stream_id, e.code)
            pos = end
        self._need = 9
        return pos

    def _frame(self, kind: int, flags: int, stream_id: int, payload: memoryview) -> None:
        if self._header_block is not None and kind != f.CONTINUATION:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "a header block not followed by its CONTINUATION")
        if kind == f.DATA:
            self._data(flags, stream_id, payload)
        elif kind == f.HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == f.CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind == f.WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == f.RST_STREAM:
            self._rst_stream(stream_id, payload)
        elif kind == f.SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == f.PING:
            self._ping(flags, stream_id, payload)
        elif kind == f.GOAWAY:
            if stream_id:
                raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "GOAWAY on a stream")
            self.go_away()
        elif kind == f.PRIORITY:
            if not stream_id:
                raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(payload) != 5:
                raise H2StreamError(stream_id, ErrorCode.FRAME_SIZE_ERROR, "PRIORITY of a length other than 5")
            if int.from_bytes(payload[:4], "big") & 0x7FFFFFFF == stream_id:  # RFC 9113 §5.3.1
                raise H2StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, f"stream {stream_id} depends on itself")
        elif kind == f.PUSH_PROMISE:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # other frame types are extensions: ignored (RFC 9113 §4.1)

    def _data(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if not stream_id:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0")
        length = len(payload)
        inflow = self._inflow
        inflow.unacked += length
        if inflow.unacked >= CONNECTION_DUE and (update := inflow.connection_due()):
            self._write(update)
        stream = self._streams.get(stream_id)
        if stream is None and stream_id in self._ended:
            return
        if stream is None or stream.remote_closed:
            if stream_id > self._last_id:
                raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            raise H2StreamError(stream_id, ErrorCode.STREAM_CLOSED, f"DATA on closed stream {stream_id}")
        if flags & f.PADDED:
            payload = f.unpad(flags, payload, stream_id)
        end_stream = bool(flags & f.END_STREAM)
        stream.recv_unacked += length
        if stream.recv_unacked >= STREAM_DUE and (update := inflow.stream_due(stream_id, stream, end_stream)):
            self._write(update)
        if end_stream:
            stream.remote_closed = True
        if stream.call is not None:
            stream.call.data(payload, end_stream)

    def _headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if not stream_id:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "HEADERS on stream 0")
        if flags & f.PADDED:
            payload = f.unpad(flags, payload, stream_id)
        if flags & f.PRIORITY_FLAG:
            if len(payload) < 5:
                raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            if int.from_bytes(payload[:4], "big") & 0x7FFFFFFF == stream_id:
                # RFC 9113 §5.3.1 names a stream error; the connection's, as its header block is not decoded
                # (HPACK's table would no longer match the client's)
                raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, f"HEADERS of stream {stream_id} depend on itself")
            payload = payload[5:]
        self._header_stream = stream_id
        self._header_end_stream = bool(flags & f.END_STREAM)
        if flags & f.END_HEADERS:
            self._header_block = None
            self._headers_complete(payload)
        else:
            self._header_block = bytearray(payload)

    def _continuation(self, flags: int, stream_id: int, payload: memoryview) -> None:
        block = self._header_block
        if block is None or stream_id != self._header_stream:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, f"CONTINUATION on stream {stream_id} without "
                                    "a header block open on it")
        block += payload
        if len(block) > MAX_HEADER_BLOCK:
            raise H2ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, f"a header block over {MAX_HEADER_BLOCK} bytes")
        if flags & f.END_HEADERS:
            self._header_block = None
            self._headers_complete(memoryview(block))

    def _headers_complete(self, block: memoryview) -> None:
        stream_id = self._header_stream
        try:
            headers = self._decoder.decode(bytes(block))
        except HpackError as e:
            raise H2ConnectionError(ErrorCode.COMPRESSION_ERROR, f"HPACK: {e}") from e
        stream = self._streams.get(stream_id)
        if stream is None and stream_id in self._ended:
            return  # trailers in flight on a stream we ended (decoded all the same: HPACK's table is shared)
        if stream is not None:  # trailers from the client: they may only end the stream
            if stream.remote_closed or not self._header_end_stream:
                raise H2StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "a second HEADERS without END_STREAM")
            stream.remote_closed = True
            if stream.call is not None:
                stream.call.data(memoryview(b""), True)
            return
        if stream_id % 2 == 0 or stream_id <= self._last_id:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, f"HEADERS opening stream {stream_id}: stream ids "
                                    f"must be odd and increasing (last {self._last_id})")
        self._last_id = stream_id
        if self._closing:
            raise H2StreamError(stream_id, ErrorCode.REFUSED_STREAM, "the server is going away")
        if len(self._streams) >= MAX_STREAMS:
            raise H2StreamError(stream_id, ErrorCode.REFUSED_STREAM, f"more than {MAX_STREAMS} streams open")
        stream = H2Stream(self._peer_window, self._header_end_stream)
        self._streams[stream_id] = stream
        stream.call = self._opener(self, stream_id, headers, self._header_end_stream)

    # --- output ---------------------------------------------------------------------------------------------
    def respond(self, stream_id: int, head: bytes | None, body: bytes, trailers: bytes | None) -> None:
        """Send response headers (if any), DATA, and trailers (if any: they end the stream) on ``stream_id``."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return  # reset by the client meanwhile
        out: list[bytes] = []
        if head is not None:
            self._sender.header_frames(out, stream_id, head, end_stream=False)
        ended = self._sender.send(out, stream_id, stream, body, trailers)
        if out:
            self._write(b"".join(out))
        if not ended and (stream.pending or stream.trailers is not None):
            self._blocked[stream_id] = stream  # revisited when a window opens or the transport resumes
        elif ended:  # after the write: closing the stream may close the connection (GOAWAY sent)
            self._closed(stream_id, stream)

    def respond_message(self, stream_id: int, head: bytes, message: bytes, trailers: bytes) -> None:
        """A whole unary gRPC answer on ``stream_id``: headers, ``message`` behind gRPC's 5-byte length prefix,
        trailers. When each fits one frame and the windows, the three frames are packed in one join (what
        ``respond`` writes, without its queue); otherwise it is ``respond``."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        sender = self._sender
        size = 5 + len(message)
        # one bound for the three frames: each then fits the peer's frame size
        if (sender.table_update or sender.paused or stream.pending or size > stream.send_window
                or size > sender.window or size + len(head) + len(trailers) > sender.frame_size):
            self.respond(stream_id, head, b"\x00" + len(message).to_bytes(4, "big") + message, trailers)
            return
        pack = _PACK_HEADER
        frames = b"".join((pack(len(head) << 8 | _HEADERS, _END_HEADERS, stream_id), head,
                           _PACK_DATA_MESSAGE(size << 8, 0, stream_id, 0, size - 5), message,
                           pack(len(trailers) << 8 | _HEADERS, _END_TRAILERS, stream_id), trailers))
        cork = self._cork
        if cork is not None:
            cork.append(frames)
        else:
            self._write(frames)
        stream.send_window -= size
        sender.window -= size
        if stream.remote_closed and not stream.held and not self._closing:
            # _closed for the usual case: nothing to reset, release or finish; answered streams refill the budget
            del self._streams[stream_id]
            if self._reset_budget < RESET_BUDGET:
                self._reset_budget += 1
        else:
            self._closed(stream_id, stream)

    def trailers_only(self, stream_id: int, block: bytes) -> None:
        """End ``stream_id`` with one HEADERS frame (a gRPC error before any response)."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        out: list[bytes] = []
        self._sender.header_frames(out, stream_id, block, end_stream=True)
        self._write(b"".join(out))
        self._closed(stream_id, stream)

    def hold(self, stream_id: int, held: bool) -> None:
        """Stop (``held``) or resume granting window for ``stream_id``'s input (the connection's goes on)."""
        stream = self._streams.get(stream_id)
        if stream is not None and (update := self._inflow.hold(stream_id, stream, held)):
            self._write(update)

    def output_waiting(self, stream_id: int) -> bool:
        """Whether ``stream_id`` has response bytes the client's window or its reading has not let out."""
        stream = self._streams.get(stream_id)
        return stream is not None and bool(stream.pending)

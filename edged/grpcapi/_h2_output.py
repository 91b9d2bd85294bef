"""A stream's state and our half of an HTTP/2 connection's output (``_h2_connection`` owns both).

`Sender` keeps the invariants of what edged writes: a header block is cut to the peer's SETTINGS_MAX_FRAME_SIZE
(HEADERS, then CONTINUATION) and opened with a pending dynamic table size update; DATA never exceeds the
stream's or the connection's send window and is not produced while the transport is paused; a stream's
trailers leave only after its last DATA. ``unsent`` is the DATA every stream of the connection keeps waiting
(the connection compares it with ``[server] grpc_max_unsent_mb``) and ``progress`` moves whenever some of it
leaves or the transport resumes, so a connection whose peer stopped reading can be told apart from a slow one.
"""

from __future__ import annotations

from typing import Protocol

from edged.grpcapi import _h2_frames as f


class Call(Protocol):
    """What a stream's application side (a gRPC call) receives from the connection."""

    def data(self, chunk: memoryview, end_stream: bool) -> None: ...

    def cancel(self) -> None: ...

    def expire(self, now: float) -> None: ...

    def drained(self) -> None: ...


class H2Stream:
    __slots__ = ("call", "held", "pending", "recv_unacked", "remote_closed", "send_window", "trailers")

    def __init__(self, send_window: int, remote_closed: bool) -> None:
        self.call: Call | None = None
        self.remote_closed = remote_closed
        self.send_window = send_window
        self.recv_unacked = 0
        self.held = False  # its call takes no more input for now: no WINDOW_UPDATE is granted for it
        self.pending = bytearray()  # DATA payload waiting for window
        self.trailers: bytes | None = None  # a header block to send once ``pending`` is out


class Sender:
    __slots__ = ("frame_size", "paused", "progress", "table_update", "unsent", "window")

    def __init__(self) -> None:
        self.frame_size = f.DEFAULT_FRAME_SIZE  # the peer's SETTINGS_MAX_FRAME_SIZE
        self.window = f.DEFAULT_WINDOW  # the connection's send window
        self.paused = False  # the transport's buffer is full: the peer does not read
        self.table_update = b""  # announced at the start of our next header block
        self.unsent = 0  # DATA bytes waiting in the streams' ``pending``, all streams together
        self.progress = 0  # moves whenever waiting output leaves (or may: the transport resumed)

    def header_frames(self, out: list[bytes], stream_id: int, block: bytes, end_stream: bool) -> None:
        if self.table_update:
            block, self.table_update = self.table_update + block, b""
        limit = self.frame_size
        flags = f.END_STREAM if end_stream else 0
        if len(block) <= limit:
            out.append(f.frame(f.HEADERS, flags | f.END_HEADERS, stream_id, block))
            return
        out.append(f.frame(f.HEADERS, flags, stream_id, block[:limit]))
        for start in range(limit, len(block), limit):
            last = start + limit >= len(block)
            out.append(f.frame(f.CONTINUATION, f.END_HEADERS if last else 0, stream_id, block[start:start + limit]))

    def send(self, out: list[bytes], stream_id: int, stream: H2Stream, body: bytes, trailers: bytes | None) -> bool:
        """Queue ``body`` (and ``trailers``) on ``stream`` and append what the windows allow; True once the
        trailers are in. A body that fits at once is framed as it is, without a copy."""
        size = len(body)
        if (size and not stream.pending and not self.paused and size <= self.frame_size
                and size <= stream.send_window and size <= self.window):
            out.append(f.frame_header(f.DATA, 0, stream_id, size))
            out.append(body)
            stream.send_window -= size
            self.window -= size
        elif size:
            stream.pending += body
            self.unsent += size
        if trailers is not None:
            stream.trailers = trailers
        return self.drain(out, stream_id, stream)

    def drain(self, out: list[bytes], stream_id: int, stream: H2Stream) -> bool:
        """Append what the windows allow of ``stream``'s output to ``out``; True once its trailers are in."""
        pending = stream.pending
        while pending and not self.paused:
            size = min(len(pending), self.frame_size, stream.send_window, self.window)
            if size <= 0:
                return False
            out.append(f.frame_header(f.DATA, 0, stream_id, size))
            if size == len(pending):
                out.append(bytes(pending))
                pending.clear()
            else:
                out.append(bytes(pending[:size]))
                del pending[:size]
            stream.send_window -= size
            self.window -= size
            self.unsent -= size
            self.progress += 1
        if pending or stream.trailers is None:
            return False
        trailers, stream.trailers = stream.trailers, None
        self.header_frames(out, stream_id, trailers, end_stream=True)
        return True

    def discard(self, stream: H2Stream) -> None:
        """``stream`` ended before its output left (a reset, the connection's end): that output is not owed."""
        if stream.pending:
            self.unsent -= len(stream.pending)
            stream.pending = bytearray()

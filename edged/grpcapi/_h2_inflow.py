"""Our receive windows on one HTTP/2 connection: what the peer may still send, and when edged grants more.

Invariants: the peer never has more than ``CONNECTION_WINDOW`` unacknowledged on the connection nor
``STREAM_WINDOW`` on a stream (past either is its flow-control error); a window is granted back once half of it
is used, except a held stream's (its call takes no more input): its window is not granted, so a client writing
faster than edged answers waits in that stream's flow control. The connection's window is granted whatever
streams are held: what a held stream keeps is bounded by its own window (and charged to the in-flight budget
by its call), so one held stream never stalls the others.
Each method returns the WINDOW_UPDATE frames to write (``b""`` for none); the connection writes them. The
connection adds each DATA frame's length to ``unacked`` and its stream's ``recv_unacked`` itself and calls
``connection_due`` or ``stream_due`` only once that reaches ``CONNECTION_DUE`` or ``STREAM_DUE`` (half the
window): the checks of every frame cost no call, and the window's limit is checked where it can be passed.
"""

from __future__ import annotations

from edged.grpcapi import _h2_frames as f
from edged.grpcapi._h2_frames import ErrorCode, H2ConnectionError, H2StreamError
from edged.grpcapi._h2_output import H2Stream

STREAM_WINDOW = 8 << 20
CONNECTION_WINDOW = 16 << 20
STREAM_DUE = STREAM_WINDOW // 2
CONNECTION_DUE = CONNECTION_WINDOW // 2


class Inflow:
    __slots__ = ("held", "unacked")

    def __init__(self) -> None:
        self.unacked = 0  # connection bytes received and not granted back
        self.held = 0  # streams held

    def connection_due(self) -> bytes:
        """``unacked`` (with the DATA just arrived) has reached ``CONNECTION_DUE``."""
        if self.unacked > CONNECTION_WINDOW:
            raise H2ConnectionError(ErrorCode.FLOW_CONTROL_ERROR, "DATA beyond the connection's window")
        if self.unacked >= CONNECTION_DUE:
            return self._grant()
        return b""

    @staticmethod
    def stream_due(stream_id: int, stream: H2Stream, end_stream: bool) -> bytes:
        """``stream.recv_unacked`` (with the DATA just arrived) has reached ``STREAM_DUE``."""
        if stream.recv_unacked > STREAM_WINDOW:
            raise H2StreamError(stream_id, ErrorCode.FLOW_CONTROL_ERROR, "DATA beyond the stream's window")
        if not end_stream and not stream.held and stream.recv_unacked >= STREAM_DUE:
            update = f.window_update(stream_id, stream.recv_unacked)
            stream.recv_unacked = 0
            return update
        return b""

    def hold(self, stream_id: int, stream: H2Stream, held: bool) -> bytes:
        """Hold or release ``stream``; released, what it used is granted back."""
        if stream.held == held:
            return b""
        stream.held = held
        self.held += 1 if held else -1
        if held:
            return b""
        update = b""
        if stream.recv_unacked and not stream.remote_closed:
            update = f.window_update(stream_id, stream.recv_unacked)
            stream.recv_unacked = 0
        return update

    def forget(self, stream: H2Stream) -> None:
        """``stream`` ended: it is held no more."""
        if stream.held:
            stream.held = False
            self.held -= 1

    def _grant(self) -> bytes:
        update = f.window_update(0, self.unacked)
        self.unacked = 0
        return update

"""The cold half of one HTTP/2 connection (``_h2_connection`` is the hot half: frames parsed, streams opened
and answered): the connection's state, the peer's control frames (SETTINGS, PING, WINDOW_UPDATE, RST_STREAM),
the flood guards, a stream's end, and the connection's own (GOAWAY, linger, the sweeper's idle check).

Invariants (the connection's, stated in ``_h2_connection``): a control frame answered, or a stream ended by us
(a trailers-only error, its RST_STREAM), while the peer is not reading counts toward ``MAX_UNREAD_CONTROL``;
SETTINGS frames spend a budget of ``SETTINGS_BURST`` refilled at ``SETTINGS_PER_S``, and one costs its entries
plus at most one pass over the streams (a new initial window is applied once per frame); a stream whose output
waits is in ``_blocked``, and only those streams are revisited when a window opens or the transport resumes, so
a WINDOW_UPDATE with nothing waiting costs what a PING costs; a reset of a stream still owed an answer spends
``RESET_BUDGET``,
which answered streams refill; our GOAWAY is sent once, and after ``fail`` nothing more is written but the
GOAWAY, nothing the peer sends is read, and the transport is aborted ``LINGER_S`` later at the latest.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

from edged.access import UNKNOWN_PEER, Peer, peer_of
from edged.grpcapi import _h2_frames as f
from edged.grpcapi import _hpack as hpack
from edged.grpcapi._h2_frames import ErrorCode, H2ConnectionError, H2StreamError
from edged.grpcapi._h2_inflow import STREAM_WINDOW, Inflow
from edged.grpcapi._h2_output import H2Stream, Sender

log = logging.getLogger(__name__)

MAX_STREAMS = 128
MAX_HEADER_LIST = 64 << 10
MAX_HEADER_BLOCK = 64 << 10
MAX_UNREAD_CONTROL = 1024
LINGER_S = 2.0
# A connection that has not sent the client preface and its SETTINGS this long after it was made is closed (or
# request_timeout_s after, if shorter): a silent connection would otherwise hold a slot for idle_timeout_s.
PREFACE_TIMEOUT_S = 5.0
UNSENT_LIMIT = 64 << 20  # [server] grpc_max_unsent_mb's default
RESET_BUDGET = 256  # client resets of streams still owed an answer, refilled one per answered stream
# A client sends SETTINGS at its start and now and then after (grpc-core when its BDP estimate changes): a
# burst of 64 and 16 a second leave any client room, and bound what a flood of them costs the loop.
SETTINGS_BURST = 64
SETTINGS_PER_S = 16.0
OUR_SETTINGS = {f.MAX_CONCURRENT_STREAMS: MAX_STREAMS, f.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                f.MAX_FRAME_SIZE: f.DEFAULT_FRAME_SIZE, f.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
                f.ENABLE_PUSH: 0}


class H2Counts:
    """What one server's connections sent the peers, for ``/metrics``: the error codes of our GOAWAY and
    RST_STREAM frames (a bounded set: ``ErrorCode``'s members), REFUSED_STREAM apart, NO_ERROR not at all."""

    __slots__ = ("errors", "streams_refused")

    def __init__(self) -> None:
        self.errors: dict[ErrorCode, int] = {}
        self.streams_refused = 0


class H2Control(asyncio.Protocol):
    """The state and cold paths ``H2Connection`` inherits (inherited methods cost the hot path no call)."""

    def __init__(self, counts: H2Counts, unsent_limit: int = UNSENT_LIMIT) -> None:
        self._counts = counts
        self.unsent_limit = unsent_limit  # [server] grpc_max_unsent_mb: answers held unsent past it are refused
        self._stalled_since = 0.0  # since when waiting output has not moved (the sweeper's view)
        self._progress_seen = 0  # the sender's progress at that time
        self._transport: asyncio.Transport | None = None
        self._streams: dict[int, H2Stream] = {}
        # streams whose output waits for a window or the transport (DATA pending, or trailers behind it)
        self._blocked: dict[int, H2Stream] = {}
        self._last_id = 0
        self._peer_window = f.DEFAULT_WINDOW
        self._sender = Sender()
        # the same, for the call layer: ``output.unsent`` is the response DATA held for streams of this connection,
        # waiting for the client's windows or reading (an attribute read, no call, on every answer's path)
        self.output = self._sender
        self._inflow = Inflow()
        self._unread_control = 0
        self._reset_budget = RESET_BUDGET
        self._settings_budget = float(SETTINGS_BURST)
        self._settings_at = 0.0  # when the budget was last refilled, on the loop's clock
        self._closing = False  # our GOAWAY is out: no new streams
        self._dead = False
        self._linger: asyncio.TimerHandle | None = None
        self._cork: list[bytes] | None = None
        # streams we ended lately: their DATA and trailers in flight are dropped quietly
        self._ended: dict[int, None] = {}
        self.now: Callable[[], float] = _no_clock  # the loop's clock, once connected
        self._last_frame = 0.0  # when bytes last arrived
        self._made_at = 0.0  # when the connection was made
        self._preface = True  # the peer's preface and first frame, which must be SETTINGS, are still to come
        self._peer: Peer | None = None  # a Unix-socket peer's credentials, once read

    def peer_credentials(self) -> Peer:
        """The Unix-socket peer (SO_PEERCRED), read once per connection, on demand: the kernel keeps the
        credentials of the process that connected, so reading them later reads those of connect time."""
        if self._peer is None:
            sock = self._transport.get_extra_info("socket") if self._transport is not None else None
            try:
                self._peer = peer_of(sock)
            except (OSError, AttributeError):
                log.warning("could not read the peer credentials of a gRPC Unix-socket client")
                self._peer = UNKNOWN_PEER
        return self._peer

    def describe_peer(self) -> str:
        """The peer, for a log line: a TCP client's address, a Unix-socket peer's credentials."""
        transport = self._transport
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is not None and sock.family == socket.AF_UNIX:
            return f"the Unix-socket peer {self.peer_credentials().describe()}"
        name = transport.get_extra_info("peername") if transport is not None else None
        return f"the TCP client {name[0]}:{name[1]}" if isinstance(name, tuple) else "a TCP client"

    def unsent_of(self, stream_id: int) -> int:
        """``unsent`` of one stream."""
        stream = self._streams.get(stream_id)
        return len(stream.pending) if stream is not None else 0

    # --- control frames from the peer -----------------------------------------------------------------------
    def _window_update(self, stream_id: int, payload: memoryview) -> None:
        increment = f.increment_of(payload)
        if not stream_id:
            if not increment:
                raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of zero on the connection")
            sender = self._sender
            spent = sender.window <= 0
            sender.window += increment
            if sender.window > f.MAX_WINDOW:
                raise H2ConnectionError(ErrorCode.FLOW_CONTROL_ERROR, "the connection's window past 2^31-1")
            # While the connection's window is open and the transport writes, every waiting stream waits for its
            # own window (each drain ran until one of the three closed): only a spent window holds output back.
            if spent and self._blocked and not sender.paused:
                self._flush(list(self._blocked.items()))
            return
        if stream_id > self._last_id:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {stream_id}")
        stream = self._streams.get(stream_id)
        if stream is None:
            return  # closed: a late update is harmless
        if not increment:
            raise H2StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of zero")
        stream.send_window += increment
        if stream.send_window > f.MAX_WINDOW:
            raise H2StreamError(stream_id, ErrorCode.FLOW_CONTROL_ERROR, "the stream's window past 2^31-1")
        if stream_id in self._blocked:  # only this stream's output can move
            self._flush([(stream_id, stream)])

    def _rst_stream(self, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "RST_STREAM of a length other than 4")
        if not stream_id or stream_id > self._last_id:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, f"RST_STREAM on idle stream {stream_id}")
        stream = self._forget(stream_id)
        if stream is None:
            return
        if stream.call is not None:
            stream.call.cancel()
        self._reset_budget -= 1
        if self._reset_budget <= 0:
            raise H2ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, "too many streams reset before their answer")
        self._maybe_finish()

    def _settings(self, flags: int, stream_id: int, payload: memoryview) -> None:
        pairs = f.settings_of(flags, stream_id, payload)
        if flags & f.ACK:
            return
        self._spend_settings()
        window = highest = -1  # the last and the largest SETTINGS_INITIAL_WINDOW_SIZE of the frame
        for key, value in pairs:
            if key == f.INITIAL_WINDOW_SIZE:
                window = value
                highest = max(highest, value)
            elif key == f.MAX_FRAME_SIZE:
                self._sender.frame_size = value
            elif key == f.HEADER_TABLE_SIZE:
                self._sender.table_update = hpack.table_size_update(0) if value < 4096 else b""
        if window >= 0:
            self._initial_window(window, highest)
        self._control(f.frame(f.SETTINGS, f.ACK, 0))

    def _spend_settings(self) -> None:
        now = self.now()
        budget = min(SETTINGS_BURST, self._settings_budget + (now - self._settings_at) * SETTINGS_PER_S) - 1
        self._settings_at = now
        if budget < 0:
            raise H2ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, f"SETTINGS frames past {SETTINGS_BURST} at once "
                                    f"and {SETTINGS_PER_S:g} a second")
        self._settings_budget = budget

    def _initial_window(self, value: int, highest: int) -> None:
        """A SETTINGS frame's INITIAL_WINDOW_SIZE entries, ``value`` the last: every stream's window moves by the
        net change once (RFC 9113 §6.9.2). Entry by entry, a window would pass 2^31-1 at the frame's ``highest``
        value if at all, so that is where the limit is checked."""
        old, self._peer_window = self._peer_window, value
        streams = self._streams.values()
        if streams and highest > old and max(s.send_window for s in streams) + highest - old > f.MAX_WINDOW:
            raise H2ConnectionError(ErrorCode.FLOW_CONTROL_ERROR, "a stream's window past 2^31-1")
        delta = value - old
        if not delta:
            return
        for stream in streams:
            stream.send_window += delta
        if delta > 0 and self._blocked and not self._sender.paused:
            self._flush(list(self._blocked.items()))

    def _ping(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if f.check_ping(flags, stream_id, payload):
            self._control(f.frame(f.PING, f.ACK, 0, bytes(payload)))

    # --- a stream's end, and our writes ---------------------------------------------------------------------
    def _flush(self, waiting: list[tuple[int, H2Stream]]) -> None:
        """Let out what the windows allow of ``waiting``'s output (streams of ``_blocked``)."""
        out: list[bytes] = []
        ended = [(stream_id, stream) for stream_id, stream in waiting if self._sender.drain(out, stream_id, stream)]
        if out:
            self._write(b"".join(out))
        for stream_id, stream in ended:
            self._closed(stream_id, stream)  # forgotten: out of _blocked
        blocked = self._blocked
        for stream_id, stream in waiting:
            if not stream.pending and blocked.get(stream_id) is stream:
                del blocked[stream_id]
                if stream.held and stream.call is not None:
                    stream.call.drained()

    def _closed(self, stream_id: int, stream: H2Stream) -> None:
        """We ended the stream: forget it, and stop a client that is still sending (RFC 9113 §8.1)."""
        if self._sender.paused:  # its end was written regardless: the frames a new stream costs are bounded so
            self._unread_answer()
        self._forget(stream_id)
        self._reset_budget = min(RESET_BUDGET, self._reset_budget + 1)
        if not stream.remote_closed:
            self._write(f.rst_stream(stream_id, ErrorCode.NO_ERROR))
            self._remember(stream_id)
        self._maybe_finish()

    def _forget(self, stream_id: int) -> H2Stream | None:
        stream = self._streams.pop(stream_id, None)
        if self._blocked:
            self._blocked.pop(stream_id, None)
        if stream is not None:
            if stream.pending:
                self._sender.discard(stream)
            self._inflow.forget(stream)
        return stream

    def _remember(self, stream_id: int) -> None:
        self._ended[stream_id] = None
        if len(self._ended) > MAX_STREAMS:
            del self._ended[next(iter(self._ended))]

    def reset(self, stream_id: int, code: ErrorCode) -> None:
        """End one stream with RST_STREAM (its call is cancelled)."""
        stream = self._forget(stream_id)
        if stream is not None:
            self._remember(stream_id)
            if stream.call is not None:
                stream.call.cancel()
        self._control(f.rst_stream(stream_id, code))  # counted once sent: a flood guard may end all instead
        counts = self._counts
        if code == ErrorCode.REFUSED_STREAM:
            counts.streams_refused += 1
        else:
            counts.errors[code] = counts.errors.get(code, 0) + 1
        self._maybe_finish()

    def _unread_answer(self) -> None:
        """A stream's end written while the peer does not read, counted with the control frames: a client that
        opens streams answered at once (errors) and reads nothing gets ENHANCE_YOUR_CALM, not a growing buffer.
        Not raised: a call may end outside the parsing of frames (the engine's callback, a deadline)."""
        self._unread_control += 1
        if self._unread_control > MAX_UNREAD_CONTROL and not self._dead:
            errors = self._counts.errors
            errors[ErrorCode.ENHANCE_YOUR_CALM] = errors.get(ErrorCode.ENHANCE_YOUR_CALM, 0) + 1
            self.fail(ErrorCode.ENHANCE_YOUR_CALM, "answers and control frames the client does not read")

    def _control(self, data: bytes) -> None:
        if self._sender.paused:
            self._unread_control += 1
            if self._unread_control > MAX_UNREAD_CONTROL:
                raise H2ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, "control frames the client does not read")
        self._write(data)

    def _write(self, data: bytes) -> None:
        if self._cork is not None:
            self._cork.append(data)
        elif self._transport is not None and not self._dead:
            self._transport.write(data)

    def _uncork(self) -> None:
        out, self._cork = self._cork, None
        if out:
            self._write(b"".join(out))

    # --- ending ---------------------------------------------------------------------------------------------
    @property
    def idle(self) -> bool:
        return not self._streams

    def sweep(self, now: float, idle_timeout_s: float, unread_timeout_s: float) -> None:
        """Close the connection if idle past ``idle_timeout_s``, or if its answers wait and none of them has
        left for ``unread_timeout_s`` (the peer does not read); let each call end itself if its message stalled."""
        if self._dead:
            return
        if self._preface:
            timeout = min(PREFACE_TIMEOUT_S, unread_timeout_s)
            if now - self._made_at > timeout:  # not logged: a flood of them would be as many lines
                errors = self._counts.errors
                errors[ErrorCode.PROTOCOL_ERROR] = errors.get(ErrorCode.PROTOCOL_ERROR, 0) + 1
                self._shut(ErrorCode.PROTOCOL_ERROR, f"no HTTP/2 client preface and SETTINGS within {timeout:g} s")
            return
        sender = self._sender
        if not (sender.unsent or sender.paused) or sender.progress != self._progress_seen:
            self._stalled_since, self._progress_seen = now, sender.progress
        elif now - self._stalled_since > unread_timeout_s:
            log.warning("gRPC connection of %s closed with GOAWAY ENHANCE_YOUR_CALM: %d bytes of answers waited "
                        "unread for %g s ([server] request_timeout_s); the client stopped reading",
                        self.describe_peer(), sender.unsent, unread_timeout_s)
            errors = self._counts.errors
            errors[ErrorCode.ENHANCE_YOUR_CALM] = errors.get(ErrorCode.ENHANCE_YOUR_CALM, 0) + 1
            self._shut(ErrorCode.ENHANCE_YOUR_CALM, f"answers unread for {unread_timeout_s:g} s")
            return
        if not self._streams:
            if now - self._last_frame > idle_timeout_s:
                log.info("gRPC connection closed: no stream and no frame for %g s ([server] idle_timeout_s)",
                         idle_timeout_s)
                self.go_away()
            return
        for stream in list(self._streams.values()):
            if stream.call is not None:
                stream.call.expire(now)

    def go_away(self) -> None:
        """Take no new streams, answer those open, then close (a server's stop, or the peer's GOAWAY)."""
        if not self._closing:
            self._closing = True
            self._write(f.goaway(self._last_id, ErrorCode.NO_ERROR))
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        if self._closing and not self._streams and self._transport is not None:
            self._uncork()
            self._dead = True
            self._transport.close()

    def fail(self, code: ErrorCode, message: str) -> None:
        """End the connection with GOAWAY ``code``. Our side is shut first and what the peer still sends is
        dropped for up to ``LINGER_S``: closing with unread bytes would reset the connection and could destroy
        the GOAWAY before the peer reads it."""
        log.info("gRPC connection closed: %s (%s)", message, code.name)
        self._shut(code, message)

    def _shut(self, code: ErrorCode, message: str) -> None:
        """``fail`` without its log line (a refused connection: the server logs refusals, a few lines a flood)."""
        transport = self._transport
        if transport is None or self._dead:
            return
        self._dead = True
        transport.write(f.goaway(self._last_id, code, message.encode()[:200]))
        if transport.can_write_eof():
            transport.write_eof()
        self._linger = asyncio.get_running_loop().call_later(LINGER_S, transport.abort)

    def abort(self) -> None:
        """Close at once, dropping what is unsent; before ``connection_made``, as soon as it is made."""
        self._dead = True
        if self._transport is not None:
            self._transport.abort()


def _no_clock() -> float:
    raise RuntimeError("the connection's clock is read before connection_made")

"""HTTP/2 (RFC 9113) wire constants, the two errors a peer can cause, and the frames the server writes.

Frames are read in place from the connection's buffer (``edged.grpcapi._h2_connection``) and written here as
``bytes`` with one ``struct.pack`` for the 9-byte header: no frame objects on the hot path. The header blocks
they carry are encoded by ``edged.grpcapi._hpack`` without the dynamic table.
"""

from __future__ import annotations

import struct
from enum import IntEnum

from edged.errors import InvalidInput

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADER = struct.Struct(">I B I")
_SETTING = struct.Struct(">HI")  # 24-bit length and type packed in the first word, flags, stream id
MAX_WINDOW = (1 << 31) - 1
DEFAULT_WINDOW = 65535
DEFAULT_FRAME_SIZE = 16384
MAX_FRAME_SIZE_LIMIT = (1 << 24) - 1

# frame types
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
# flags
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
# settings identifiers
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, \
    MAX_HEADER_LIST_SIZE = range(1, 7)


class ErrorCode(IntEnum):
    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


class H2ConnectionError(InvalidInput):
    """The peer broke the protocol: the connection ends with GOAWAY carrying ``code``."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class H2StreamError(InvalidInput):
    """One stream broke the protocol: that stream ends with RST_STREAM carrying ``code``, the others go on."""

    def __init__(self, stream_id: int, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.stream_id = stream_id
        self.code = code


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload) << 8 | kind, flags, stream_id) + payload


def frame_header(kind: int, flags: int, stream_id: int, length: int) -> bytes:
    return HEADER.pack(length << 8 | kind, flags, stream_id)


def settings_frame(values: dict[int, int]) -> bytes:
    payload = b"".join(struct.pack(">HI", key, value) for key, value in values.items())
    return frame(SETTINGS, 0, 0, payload)


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", increment))


def rst_stream(stream_id: int, code: ErrorCode) -> bytes:
    return frame(RST_STREAM, 0, stream_id, struct.pack(">I", code))


def goaway(last_stream_id: int, code: ErrorCode, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, struct.pack(">II", last_stream_id, code) + debug)


# --- checks of what the peer sends (RFC 9113 §6) --------------------------------------------------------------
def check_preface(data: bytes) -> bool:
    """True once ``data`` holds the whole client preface, False while it is a beginning of it."""
    if data[:len(PREFACE)] != PREFACE[:len(data)]:
        raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface (edged's gRPC "
                                "listener speaks HTTP/2 with prior knowledge only)")
    return len(data) >= len(PREFACE)


def increment_of(payload: memoryview) -> int:
    if len(payload) != 4:
        raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "WINDOW_UPDATE of a length other than 4")
    return int.from_bytes(payload, "big") & 0x7FFFFFFF


def unpad(flags: int, payload: memoryview, stream_id: int) -> memoryview:
    """The payload of a DATA or HEADERS frame without its padding."""
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, f"padding longer than the frame on stream {stream_id}")
    return payload[1:len(payload) - payload[0]]


def settings_of(flags: int, stream_id: int, payload: memoryview) -> list[tuple[int, int]]:
    """A SETTINGS frame's (identifier, value) pairs, each value checked; none for an ACK."""
    if stream_id:
        raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
    if flags & ACK:
        if payload:
            raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
        return []
    if len(payload) % 6:
        raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS of a length not a multiple of 6")
    pairs = [_SETTING.unpack_from(payload, offset) for offset in range(0, len(payload), 6)]
    for key, value in pairs:
        if key == INITIAL_WINDOW_SIZE and value > MAX_WINDOW:
            raise H2ConnectionError(ErrorCode.FLOW_CONTROL_ERROR, f"SETTINGS_INITIAL_WINDOW_SIZE {value}")
        if key == MAX_FRAME_SIZE and not DEFAULT_FRAME_SIZE <= value <= MAX_FRAME_SIZE_LIMIT:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value}")
        if key == ENABLE_PUSH and value > 1:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {value}")
    return pairs


def check_ping(flags: int, stream_id: int, payload: memoryview) -> bool:
    """True when the PING wants an ACK."""
    if stream_id:
        raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
    if len(payload) != 8:
        raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "PING of a length other than 8")
    return not flags & ACK

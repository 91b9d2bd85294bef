"""A tiny HTTP/2 client for the hostile tests: it writes any frame, valid or not, on a real socket and reads the
server's frames back. Requests are encoded as HPACK literals without indexing (no table, no Huffman), which
every decoder must accept; the server's header blocks are decoded with edged's own HPACK decoder."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from edged.grpcapi._hpack import Decoder

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED = 0x1, 0x1, 0x4, 0x8
PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED, FRAME_SIZE_ERROR = 0x1, 0x3, 0x5, 0x6
REFUSED_STREAM, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x7, 0x9, 0xB
SERVICE = "/inference.GRPCInferenceService/"


@dataclass(frozen=True)
class Frame:
    kind: int
    flags: int
    stream: int
    payload: bytes

    @property
    def code(self) -> int:
        """The error code of a GOAWAY or RST_STREAM."""
        offset = 4 if self.kind == GOAWAY else 0
        return int(struct.unpack_from(">I", self.payload, offset)[0])


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I B I", len(payload) << 8 | kind, flags, stream) + payload


def _string(value: bytes) -> bytes:
    if len(value) < 127:
        return bytes((len(value),)) + value
    rest, out = len(value) - 127, bytearray((127,))
    while rest >= 128:
        out.append(rest & 0x7F | 0x80)
        rest >>= 7
    return bytes(out) + bytes((rest,)) + value


def block(headers: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(b"\x00" + _string(name) + _string(value) for name, value in headers)


def request_block(method: str, extra: list[tuple[bytes, bytes]] | None = None) -> bytes:
    return block([(b":method", b"POST"), (b":scheme", b"http"), (b":path", (SERVICE + method).encode()),
                  (b":authority", b"edged"), (b"content-type", b"application/grpc"), (b"te", b"trailers"),
                  *(extra or [])])


def message(body: bytes) -> bytes:
    return b"\x00" + len(body).to_bytes(4, "big") + body


def data_frames(stream: int, body: bytes, end_stream: bool = True) -> list[bytes]:
    """``body`` as DATA frames of the default maximum size (16,384 bytes), the last one ending the stream."""
    chunks = [body[start:start + 16384] for start in range(0, len(body), 16384)] or [b""]
    return [frame(DATA, END_STREAM if end_stream and index == len(chunks) - 1 else 0, stream, chunk)
            for index, chunk in enumerate(chunks)]


class RawH2:
    def __init__(self, address: str, receive_buffer: int | None = None, family: int = socket.AF_INET) -> None:
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        if receive_buffer is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(30)
        if family == socket.AF_UNIX:
            self.sock.connect(address)
        else:
            host, port = address.rsplit(":", 1)
            self.sock.connect((host, int(port)))
        self._buffer = b""
        self.decoder = Decoder()

    @classmethod
    def unix(cls, path: Path) -> RawH2:
        return cls(str(path), family=socket.AF_UNIX)

    def __enter__(self) -> RawH2:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def send(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))

    def start(self, settings: bytes = b"") -> None:
        self.send(PREFACE, frame(SETTINGS, 0, 0, settings))

    def read(self) -> Frame | None:
        """The next frame, or None once the server has closed the connection."""
        while True:
            if len(self._buffer) >= 9:
                word, flags, stream = struct.unpack_from(">I B I", self._buffer)
                end = 9 + (word >> 8)
                if len(self._buffer) >= end:
                    payload, self._buffer = self._buffer[9:end], self._buffer[end:]
                    return Frame(word & 0xFF, flags, stream & 0x7FFFFFFF, payload)
            try:
                chunk = self.sock.recv(1 << 16)
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            self._buffer += chunk

    def until(self, kind: int, stream: int | None = None) -> Frame:
        """Read up to the first frame of ``kind`` (on ``stream``, if given), answering nothing."""
        while (got := self.read()) is not None:
            if got.kind == kind and (stream is None or got.stream == stream):
                return got
        raise AssertionError(f"the connection closed before a frame of type {kind}")

    def goaway(self) -> Frame:
        """The server's GOAWAY; after it the server closes the connection."""
        got = self.until(GOAWAY)
        while self.read() is not None:
            pass
        return got

    def call(self, stream: int, method: str, body: bytes) -> tuple[dict[bytes, bytes], bytes]:
        """A complete unary call: (the response's headers and trailers merged, the message bytes)."""
        self.send(frame(HEADERS, END_HEADERS, stream, request_block(method)), *data_frames(stream, message(body)))
        return self.response(stream)

    def response(self, stream: int, data: bytes = b"") -> tuple[dict[bytes, bytes], bytes]:
        """Read ``stream``'s response to its end (``data``: the DATA already read of it)."""
        fields: dict[bytes, bytes] = {}
        while (got := self.read()) is not None:
            if got.stream != stream:
                continue
            if got.kind == HEADERS:
                fields.update(self.decoder.decode(got.payload))
            elif got.kind == DATA:
                data += got.payload
            elif got.kind == RST_STREAM:
                raise AssertionError(f"stream {stream} reset with code {got.code}")
            if got.flags & END_STREAM:
                return fields, data[5:]
        raise AssertionError(f"the connection closed before stream {stream} ended")

"""HPACK with a real gRPC client: grpcio (gRPC's C core, as tritonclient and perf_analyzer use it) calls a raw
HTTP/2 listener in this test, which records the request HEADERS blocks and answers with our Encoder's blocks.

The core Huffman-codes literal values and indexes them on a channel's first call, so the second call on the
same channel is mostly indexed fields: both are decoded in order by one Decoder, as a connection would.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
import pytest

from edged.grpcapi._hpack import Decoder, Encoder

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS, CONTINUATION = 0x0, 0x1, 0x4, 0x9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
PATH = "/inference.GRPCInferenceService/ModelInfer"
REPLY = b"\x0a\x02ok"  # some protobuf bytes: the client is given no deserializer


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"peer closed after {len(data)} of {n} bytes")
        data += chunk
    return bytes(data)


def _header_fragment(flags: int, payload: bytes) -> bytes:
    """A HEADERS payload without its padding and priority fields (RFC 9113 §6.2)."""
    start, end = 0, len(payload)
    if flags & PADDED:
        start, end = 1, len(payload) - payload[0]
    if flags & PRIORITY:
        start += 5
    return payload[start:end]


@dataclass
class RawH2Listener:
    """One connection's worth of HTTP/2: records each request's header block, answers each call with OK."""

    sock: socket.socket
    blocks: list[bytes] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def serve(self) -> None:
        try:
            conn, _ = self.sock.accept()
            with conn:
                conn.settimeout(10)
                if _read_exactly(conn, len(PREFACE)) != PREFACE:
                    raise ConnectionError("no HTTP/2 client preface")
                conn.sendall(_frame(SETTINGS, 0, 0))
                self._frames(conn, Encoder())
        except (OSError, ConnectionError) as e:
            self.errors.append(e)

    def _frames(self, conn: socket.socket, encoder: Encoder) -> None:
        pending = bytearray()
        while True:
            head = _read_exactly(conn, 9)
            length, kind, flags = int.from_bytes(head[:3], "big"), head[3], head[4]
            stream = int.from_bytes(head[5:], "big") & 0x7FFFFFFF
            payload = _read_exactly(conn, length)
            if kind == SETTINGS and not flags & ACK:
                conn.sendall(_frame(SETTINGS, ACK, 0))
            elif kind in (HEADERS, CONTINUATION):
                pending += _header_fragment(flags, payload) if kind == HEADERS else payload
                if flags & END_HEADERS:
                    self.blocks.append(bytes(pending))
                    pending.clear()
            if kind in (HEADERS, DATA) and flags & END_STREAM:
                self._answer(conn, encoder, stream)

    @staticmethod
    def _answer(conn: socket.socket, encoder: Encoder, stream: int) -> None:
        response = encoder.encode([(b":status", b"200"), (b"content-type", b"application/grpc")])
        trailers = encoder.encode([(b"grpc-status", b"0"), (b"grpc-message", b"")])
        message = b"\x00" + struct.pack(">I", len(REPLY)) + REPLY
        conn.sendall(_frame(HEADERS, END_HEADERS, stream, response) + _frame(DATA, 0, stream, message)
                     + _frame(HEADERS, END_HEADERS | END_STREAM, stream, trailers))


@pytest.fixture
def listener() -> Iterator[RawH2Listener]:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        sock.settimeout(20)
        server = RawH2Listener(sock)
        thread = threading.Thread(target=server.serve, daemon=True)
        thread.start()
        yield server
    thread.join(timeout=15)


def test_grpc_core_request_blocks_decode_on_first_and_second_call(listener: RawH2Listener) -> None:
    with grpc.insecure_channel(listener.target) as channel:
        call = channel.unary_unary(PATH)
        assert call(b"first", timeout=10, metadata=[("x-edged-key", "secret-1")]) == REPLY
        assert call(b"second", timeout=10, metadata=[("x-edged-key", "secret-1")]) == REPLY
    assert len(listener.blocks) == 2, listener.errors
    decoder = Decoder()
    first, second = (dict(decoder.decode(block)) for block in listener.blocks)
    for headers in (first, second):
        assert headers[b":method"] == b"POST"
        assert headers[b":path"] == PATH.encode()
        assert headers[b":scheme"] == b"http"
        assert headers[b"content-type"] == b"application/grpc"
        assert headers[b"te"] == b"trailers"
        assert headers[b"x-edged-key"] == b"secret-1"
        assert headers[b"user-agent"].startswith(b"grpc-python")
    assert len(listener.blocks[1]) < len(listener.blocks[0])  # the second call indexes what the first inserted
    assert len(decoder.table) > 0


def test_grpc_core_blocks_decode_in_order_across_many_calls(listener: RawH2Listener) -> None:
    with grpc.insecure_channel(listener.target) as channel:
        call = channel.unary_unary(PATH)
        for i in range(6):
            assert call(b"x", timeout=10, metadata=[("x-request", f"r{i}" * (i * 40))]) == REPLY
    decoder = Decoder()
    decoded = [dict(decoder.decode(block)) for block in listener.blocks]
    assert [d.get(b"x-request", b"") for d in decoded] == [f"r{i}".encode() * (i * 40) for i in range(6)]

"""HPACK with a real gRPC client: grpcio (gRPC's C core, as tritonclient and perf_analyzer use it) calls a raw
HTTP/2 listener in this test, which records the request HEADERS blocks and answers with our Encoder's blocks.

The core Huffman-codes literal values and indexes them on a channel's first call, so the second call on the
same channel is mostly indexed fields: both are decoded in order by one Decoder, as a connection would.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
import pytest
from test_grpcapi_perf_analyzer import PERF_ANALYZER

from edged.grpcapi._hpack import Decoder, Encoder

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS, CONTINUATION = 0x0, 0x1, 0x4, 0x9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
PATH = "/inference.GRPCInferenceService/ModelInfer"
REPLY = b""  # an empty message: every protobuf type parses it (the clients are given no deserializer)


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
    """HTTP/2 enough for unary gRPC calls: records each connection's request header blocks, in order, and
    answers every call with OK and ``REPLY``."""

    sock: socket.socket
    connections: list[list[bytes]] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    recorded: threading.Condition = field(default_factory=threading.Condition)

    def wait_for_blocks(self, count: int, timeout: float) -> bool:
        """Whether some connection has recorded ``count`` blocks within ``timeout`` seconds."""
        with self.recorded:
            return self.recorded.wait_for(lambda: any(len(c) >= count for c in self.connections), timeout)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    @property
    def blocks(self) -> list[bytes]:
        """The first connection's blocks."""
        return self.connections[0] if self.connections else []

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # the fixture closed the listening socket
                return
            blocks: list[bytes] = []
            with self.recorded:
                self.connections.append(blocks)
            threading.Thread(target=self._connection, args=(conn, blocks), daemon=True).start()

    def _connection(self, conn: socket.socket, blocks: list[bytes]) -> None:
        try:
            with conn:
                conn.settimeout(10)
                if _read_exactly(conn, len(PREFACE)) != PREFACE:
                    raise ConnectionError("no HTTP/2 client preface")
                conn.sendall(_frame(SETTINGS, 0, 0))
                self._frames(conn, Encoder(), blocks)
        except (OSError, ConnectionError) as e:
            self.errors.append(e)

    def _frames(self, conn: socket.socket, encoder: Encoder, blocks: list[bytes]) -> None:
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
                    with self.recorded:
                        blocks.append(bytes(pending))
                        self.recorded.notify_all()
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
        server = RawH2Listener(sock)
        thread = threading.Thread(target=server.serve, daemon=True)
        thread.start()
        yield server
        sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() (Linux), so serve() returns
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


@pytest.mark.skipif(not PERF_ANALYZER.exists(), reason=f"perf_analyzer not found at {PERF_ANALYZER}")
def test_perf_analyzer_grpc_cpp_blocks_decode_and_settle_on_indexed_fields(listener: RawH2Listener) -> None:
    """perf_analyzer's gRPC C++ client: metadata and config calls, then ModelInfer in a loop on one channel.
    Its exit status is not judged (the listener's empty replies are no model); its header blocks are."""
    with subprocess.Popen([str(PERF_ANALYZER), "-m", "tiny_mlp", "-i", "grpc", "-u", listener.target,
                           "--measurement-interval", "5000"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as analyzer:
        try:
            recorded = listener.wait_for_blocks(8, timeout=60)
        finally:
            analyzer.kill()
    assert recorded, (listener.connections, listener.errors)
    blocks = next(c for c in listener.connections if len(c) >= 8)[:8]
    decoder = Decoder()
    decoded = [dict(decoder.decode(block)) for block in blocks]
    for headers in decoded:
        assert headers[b":method"] == b"POST"
        assert headers[b":path"].startswith(b"/inference.GRPCInferenceService/")
        assert headers[b"content-type"] == b"application/grpc"
        assert headers[b"te"] == b"trailers"
        assert headers[b"user-agent"].startswith(b"grpc-c++/")
    assert decoded[-1][b":path"] == b"/inference.GRPCInferenceService/ModelInfer"
    # The steady state: every field of a repeated ModelInfer block is indexed (high bit set), which is the
    # decoder's cached path, and each such block decodes to the same request headers.
    assert all(byte & 0x80 for byte in blocks[-1])
    assert decoded[-1] == decoded[-2]

"""The clients' HTTP handling against canned responses from a raw Unix-socket peer: chunked bodies, a daemon
that closes after answering, status codes and the X-Edged-Error family header mapped to typed errors."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edged.client import (
    AsyncEdgedClient,
    EdgedClient,
    InferenceFailedError,
    ModelNotReadyError,
    PayloadTooLargeError,
    ProtocolError,
    QueueFullError,
    UnavailableError,
)


class CannedPeer:
    """Accepts connections on a Unix socket; answers each request with the next canned response."""

    def __init__(self, path: str, responses: list[bytes]) -> None:
        self.path = path
        self.responses = list(responses)
        self.requests: list[bytes] = []
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(path)
        self.listener.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while self.responses:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        while self.responses:
            data = b""
            while b"\r\n\r\n" not in data or len(data) < self._request_length(data):
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            self.requests.append(data)
            response = self.responses.pop(0)
            conn.sendall(response)
            if b"connection: close" in response.lower():
                return

    @staticmethod
    def _request_length(data: bytes) -> int:
        # read the whole body: closing a Unix socket with unread data resets the peer's connection
        head, _, _ = data.partition(b"\r\n\r\n")
        for line in head.lower().split(b"\r\n"):
            if line.startswith(b"content-length:"):
                return len(head) + 4 + int(line.split(b":")[1])
        return len(head) + 4

    def close(self) -> None:
        self.listener.close()
        self.thread.join(5)
        os.unlink(self.path)


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[list[CannedPeer]]:
    made: list[CannedPeer] = []
    yield made
    for p in made:
        p.close()


def canned(tmp_path: Path, made: list[CannedPeer], *responses: bytes) -> str:
    path = str(tmp_path / f"canned{len(made)}.sock")
    made.append(CannedPeer(path, list(responses)))
    return path


CHUNKED = (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: application/json\r\n\r\n"
           b"7\r\n{\"name\"\r\nA\r\n: \"edged\"}\r\n0\r\n\r\n")
CLOSING = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}"


def error(status: int, message: str, family: str = "") -> bytes:
    body = f'{{"error": "{message}"}}'.encode()
    extra = f"x-edged-error: {family}\r\n".encode() if family else b""
    return b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n%s\r\n%s" % (status, len(body), extra, body)


def test_sync_reads_chunked_and_reconnects_after_connection_close(tmp_path: Path, peer) -> None:  # type: ignore[no-untyped-def]
    path = canned(tmp_path, peer, CHUNKED, CLOSING, CHUNKED)
    with EdgedClient(path) as client:
        assert client.server_metadata() == {"name": "edged"}
        assert client.status() == {}
        assert client.server_metadata() == {"name": "edged"}


def test_async_reads_chunked_and_reconnects_after_connection_close(tmp_path: Path, peer) -> None:  # type: ignore[no-untyped-def]
    path = canned(tmp_path, peer, CHUNKED, CLOSING, CHUNKED)

    async def scenario() -> None:
        async with AsyncEdgedClient(path) as client:
            assert await client.server_metadata() == {"name": "edged"}
            assert await client.status() == {}
            assert await client.server_metadata() == {"name": "edged"}
    asyncio.run(scenario())


@pytest.mark.parametrize(("response", "expected"), [
    (error(503, "model m is loading"), UnavailableError),
    (error(503, "model m is loading", "ModelNotReady"), ModelNotReadyError),
    (error(503, "queue of m is full", "QueueFull"), QueueFullError),
    (error(413, "input too large"), PayloadTooLargeError),
    (error(500, "backend crashed"), InferenceFailedError),
    (error(502, "bad gateway"), InferenceFailedError),
])
def test_status_and_family_map_to_typed_errors_keeping_the_message(tmp_path: Path, peer, response: bytes,  # type: ignore[no-untyped-def]
                                                                    expected: type[Exception]) -> None:
    path = canned(tmp_path, peer, response, response)
    message = response.rsplit(b'"error": "', 1)[1].split(b'"')[0].decode()
    with EdgedClient(path) as client, pytest.raises(expected) as raised:
        client.model_config("m")
    assert str(raised.value) == message and type(raised.value) is expected

    async def scenario() -> None:
        async with AsyncEdgedClient(path) as client:
            await client.model_config("m")
    with pytest.raises(expected):
        asyncio.run(scenario())


def test_a_non_json_answer_is_a_protocol_error(tmp_path: Path, peer) -> None:  # type: ignore[no-untyped-def]
    path = canned(tmp_path, peer, b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello")
    with EdgedClient(path) as client, pytest.raises(ProtocolError, match=r"server metadata.*not JSON"):
        client.server_metadata()


def test_requests_carry_the_binary_extension_header(tmp_path: Path, peer) -> None:  # type: ignore[no-untyped-def]
    path = canned(tmp_path, peer, error(400, "stop"))
    with EdgedClient(path) as client, pytest.raises(Exception, match="stop"):
        client.infer("m", {"x": np.zeros((1, 2), np.float32)})
    request = peer[0].requests[0].lower()
    assert request.startswith(b"post /v2/models/m/infer http/1.1")
    assert b"inference-header-content-length: " in request


CHUNKED_WITH_TRAILERS = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
                         b"3;note=first\r\n{\"n\r\n0008\r\name\": \"e\r\n5\r\ndged\"\r\n1\r\n}\r\n"
                         b"0\r\nX-Trailer: ignored\r\n\r\n")


def _run_async(path: str, *calls: str) -> list[object]:
    async def scenario() -> list[object]:
        results: list[object] = []
        async with AsyncEdgedClient(path) as client:
            for call in calls:
                try:
                    results.append(await getattr(client, call)())
                except ProtocolError as e:
                    results.append(e)
        return results
    return asyncio.run(scenario())


def test_async_reads_chunks_with_extensions_and_trailers_and_keeps_the_connection(tmp_path: Path,
                                                                                  peer) -> None:  # type: ignore[no-untyped-def]
    path = canned(tmp_path, peer, CHUNKED_WITH_TRAILERS, CHUNKED_WITH_TRAILERS)
    assert _run_async(path, "server_metadata", "server_metadata") == [{"name": "edged"}, {"name": "edged"}]
    assert len(peer[0].requests) == 2  # both answered on the one kept-alive connection


@pytest.mark.parametrize("malformed", [
    b"HTTX/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n{}",
    b"HTTP/1.1 200 OK\r\nbad header line\r\ncontent-length: 2\r\n\r\n{}",
])
def test_async_malformed_response_is_a_protocol_error_and_its_connection_is_dropped(
        tmp_path: Path, peer, malformed: bytes) -> None:  # type: ignore[no-untyped-def]
    path = canned(tmp_path, peer, malformed, CHUNKED)
    first, second = _run_async(path, "server_metadata", "server_metadata")
    assert isinstance(first, ProtocolError) and "malformed HTTP response" in str(first), first
    assert second == {"name": "edged"}  # answered on a new connection

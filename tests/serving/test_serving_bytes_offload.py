"""A large BYTES response is encoded off the event loop, over a real Unix socket, with a real ONNX Runtime model.

A BYTES output is read element by element; with millions of elements its encoding once ran on the loop thread
for seconds, and every other client of the server (a liveness probe included) waited. What is checked is not
time: a profile hook catches ``encode_response`` as it starts and, from inside it, asks ``/v2/health/live`` on
a second connection. Encoded on the loop thread, the probe cannot be answered until the encoding returns (the
hook gives up after its timeout and the test fails); encoded elsewhere, the loop answers it meanwhile. A small
BYTES response keeps the loop's path: it is encoded there, with no hop to a thread.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest
from conftest import RunningServer
from modelgen import add_identity_model

from edged.config import ServerConfig
from edged.protocol import decode_response, encode_request
from edged.serving._limits import OFFLOAD_ELEMENTS

PROBE_TIMEOUT_S = 20.0  # generous: the probe only has to be answered while the encoder waits for it


class ProbeFromEncoder:
    """A profile hook: the first ``encode_response`` after ``arm`` records its thread and, before it encodes,
    asks the server's liveness route (the encoder waits for the answer)."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.armed = False
        self.threads: list[int] = []
        self.probe: int | str | None = None

    def arm(self) -> None:
        self.threads.clear()
        self.probe = None
        self.armed = True

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or frame.f_code.co_name != "encode_response" or not self.armed:
            return
        self.armed = False
        self.threads.append(threading.get_ident())
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(PROBE_TIMEOUT_S)
        try:
            sock.connect(str(self.socket_path))
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            self.probe = int(sock.recv(4096).split(b" ", 2)[1])
        except OSError as e:
            self.probe = f"no answer: {e}"
        finally:
            sock.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, ProbeFromEncoder]]:
    tmp = tmp_path_factory.mktemp("bytes")
    add_identity_model(tmp / "repo", "strings", "BYTES", max_batch=0)
    hook = ProbeFromEncoder(tmp / "edged.sock")
    # reaches the server's loop thread and its decoding thread (started at its first use), started after this
    threading.setprofile(hook)
    try:
        running = RunningServer(tmp / "repo", ServerConfig(request_timeout_s=60.0), tmp / "edged.sock")
        yield running, hook
        running.stop()
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]


def _elements(count: int) -> np.ndarray:
    values = np.empty(count, dtype=object)
    values[:] = [b"s%d" % (i % 977) for i in range(count)]
    return values


def _infer(running: RunningServer, values: np.ndarray, binary: bool) -> np.ndarray:
    body, header_length = encode_request({"INPUT": values}, ["OUTPUT"], binary=binary)
    headers = {"content-type": "application/octet-stream"}
    if header_length is not None:
        headers["inference-header-content-length"] = str(header_length)
    conn = running.connection(timeout=120.0)
    try:
        conn.request("POST", "/v2/models/strings/infer", body=body, headers=headers)
        response = conn.getresponse()
        payload = response.read()
        assert response.status == 200, payload[:300]
        length = response.getheader("inference-header-content-length")
    finally:
        conn.close()
    _, outputs = decode_response(payload, None if length is None else int(length))
    return outputs["OUTPUT"]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_a_liveness_probe_is_answered_while_a_large_bytes_response_is_encoded(
        served: tuple[RunningServer, ProbeFromEncoder], binary: bool) -> None:
    running, hook = served
    values = _elements(4 * OFFLOAD_ELEMENTS)
    hook.arm()
    output = _infer(running, values, binary)
    assert hook.probe == 200, hook.probe
    assert hook.threads and hook.threads[0] != running._thread.ident
    assert output.tolist() == values.tolist()


def test_a_small_bytes_response_is_encoded_on_the_loop_with_no_thread_hop(
        served: tuple[RunningServer, ProbeFromEncoder]) -> None:
    running, hook = served
    hook.arm()
    hook.socket_path = hook.socket_path.with_name("no-probe.sock")  # the loop cannot answer itself: skip it
    try:
        values = _elements(100)
        assert _infer(running, values, True).tolist() == values.tolist()
    finally:
        hook.socket_path = hook.socket_path.with_name("edged.sock")
    assert hook.threads == [running._thread.ident]


def test_the_connection_keeps_its_order_when_a_large_response_is_encoded_elsewhere(
        served: tuple[RunningServer, ProbeFromEncoder]) -> None:
    """A large request, then a small one pipelined behind it on the same connection: answered in that order."""
    running, hook = served
    hook.armed = False
    large, small = _elements(2 * OFFLOAD_ELEMENTS), _elements(3)
    bodies = [encode_request({"INPUT": values}, ["OUTPUT"]) for values in (large, small)]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(120.0)
    sock.connect(str(running.socket_path))
    try:
        for body, header_length in bodies:
            sock.sendall(b"POST /v2/models/strings/infer HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n"
                         b"inference-header-content-length: %d\r\n\r\n" % (len(body), header_length or 0) + body)
        received = b""
        for values in (large, small):
            while b"\r\n\r\n" not in received:
                received += sock.recv(1 << 20)
            head, _, received = received.partition(b"\r\n\r\n")
            fields = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:])
            size = int(fields[b"content-length"])
            while len(received) < size:
                received += sock.recv(1 << 20)
            payload, received = received[:size], received[size:]
            assert head.startswith(b"HTTP/1.1 200"), head
            _, outputs = decode_response(payload, int(fields[b"inference-header-content-length"]))
            assert outputs["OUTPUT"].tolist() == values.tolist()
    finally:
        sock.close()

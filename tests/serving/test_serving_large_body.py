"""Bodies of LARGE_BODY_BYTES or more are read into their buffer past the parser, over a real Unix socket and TCP.

What is counted is the parser's work for a 6 MB body (feeds of httptools, not time); what is checked is that
every byte lands where the parser would have put it (outputs equal to the model's reference), that the next
request on the connection is parsed, and that every limit still holds before a byte of the body is read.
"""

from __future__ import annotations

import collections
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import orjson
import pytest
from conftest import RunningServer
from modelgen import add_model, mlp_reference, mlp_weights

from edged.config import ServerConfig
from edged.protocol import decode_response
from edged.serving._body_reader import LARGE_BODY_BYTES, PREALLOCATE_BYTES

OPEN_MLP = """name: "open_mlp"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "input", data_type: TYPE_FP32, dims: [ -1, 64 ] } ]
output [ { name: "output", data_type: TYPE_FP32, dims: [ -1, 10 ] } ]
"""
INFER = b"/v2/models/open_mlp/infer"
WEIGHTS = mlp_weights()


def _server(tmp: Path, **config: Any) -> RunningServer:
    repo = tmp / "repo"
    if not repo.exists():
        add_model(repo, "open_mlp", OPEN_MLP, {1: WEIGHTS})
    return RunningServer(repo, ServerConfig(**{"http_port": 0, "request_timeout_s": 2.0, **config}),
                         tmp / "edged.sock")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = _server(tmp_path_factory.mktemp("large"))
    yield running
    running.stop()


def binary_body(x: np.ndarray, size: int | None = None) -> tuple[bytes, int]:
    """A binary infer body for ``x``, its JSON header padded with spaces to make the body ``size`` bytes."""
    data = x.astype(np.float32).tobytes()
    header = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape),
                                       "parameters": {"binary_data_size": len(data)}}],
                           "parameters": {"binary_data_output": True}})
    if size is not None:
        header += b" " * (size - len(header) - len(data))
    return header + data, len(header)


def request(body: bytes, header_length: int, extra: bytes = b"") -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nInference-Header-Content-Length: %d\r\n%s\r\n"
            % (INFER, len(body), header_length, extra)) + body


class Reader:
    """Reads pipelined responses from one socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pending = b""

    def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.pending:
            chunk = self.sock.recv(1 << 20)
            assert chunk, f"closed before a response: {self.pending[:200]!r}"
            self.pending += chunk
        head, rest = self.pending.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            chunk = self.sock.recv(1 << 20)
            assert chunk, "closed inside a response"
            rest += chunk
        self.pending = rest[length:]
        return int(lines[0].split(" ", 2)[1]), headers, rest[:length]


def outputs_of(reply: tuple[int, dict[str, str], bytes]) -> np.ndarray:
    status, headers, body = reply
    assert status == 200, body[:300]
    _, outputs = decode_response(body, int(headers["inference-header-content-length"]))
    return np.asarray(outputs["output"])


def connect(server: RunningServer, tcp: bool = False) -> socket.socket:
    if tcp:
        sock = socket.create_connection(("127.0.0.1", server.tcp_port), timeout=20)
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(20)
        sock.connect(str(server.socket_path))
    return sock


def send_in_background(sock: socket.socket, data: bytes) -> threading.Thread:
    # A client that does not read its responses is not read from either (back-pressure): send from a thread.
    thread = threading.Thread(target=sock.sendall, args=(data,), daemon=True)
    thread.start()
    return thread


def frame(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 64)).astype(np.float32)


def held_body_bytes(server: RunningServer) -> int:
    status = orjson.loads(server.request("GET", "/v2/edged/status")[2])
    return int(status["limits"]["inflight_body_bytes"])


@pytest.mark.parametrize("size", [LARGE_BODY_BYTES - 1, LARGE_BODY_BYTES, LARGE_BODY_BYTES + 1,
                                  2 * LARGE_BODY_BYTES + 7])
@pytest.mark.parametrize("tcp", [False, True], ids=["uds", "tcp"])
def test_bodies_around_the_threshold_arrive_intact(server: RunningServer, size: int, tcp: bool) -> None:
    x = frame((size - 4096) // 256, size)
    body, header_length = binary_body(x, size)
    assert len(body) == size
    with connect(server, tcp) as sock:
        sender = send_in_background(sock, request(body, header_length))
        answer = outputs_of(Reader(sock).response())
        sender.join()
    assert np.allclose(answer, mlp_reference(WEIGHTS, x), atol=1e-4)


def test_a_body_past_the_preallocated_size_grows_step_by_step_and_arrives_intact(server: RunningServer) -> None:
    x = frame((PREALLOCATE_BYTES + 300_000) // 256, 9)
    body, header_length = binary_body(x)
    assert len(body) > PREALLOCATE_BYTES
    with connect(server) as sock:
        sender = send_in_background(sock, request(body, header_length))
        answer = outputs_of(Reader(sock).response())
        sender.join()
    assert np.allclose(answer, mlp_reference(WEIGHTS, x), atol=1e-4)


def test_a_request_pipelined_behind_a_large_body_is_parsed_and_answered_in_order(server: RunningServer) -> None:
    first, second = frame(4000, 1), frame(3000, 2)  # 1.0 MB and 0.77 MB
    data = (request(*binary_body(first)) + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
            + request(*binary_body(second)) + b"GET /v2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    with connect(server) as sock:
        sender = send_in_background(sock, data)
        reader = Reader(sock)
        one, live, two, meta = (reader.response() for _ in range(4))
        sender.join()
        assert sock.recv(10) == b""  # closed after the last, as it asked
    assert np.allclose(outputs_of(one), mlp_reference(WEIGHTS, first), atol=1e-4)
    assert live[0] == 200
    assert np.allclose(outputs_of(two), mlp_reference(WEIGHTS, second), atol=1e-4)
    assert meta[0] == 200 and orjson.loads(meta[2])["name"] == "edged"


def test_a_large_chunked_body_takes_the_parser_and_gives_the_same_answer(server: RunningServer) -> None:
    x = frame(3000, 3)
    body, header_length = binary_body(x)
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 100_000]), body[i:i + 100_000])
                      for i in range(0, len(body), 100_000)) + b"0\r\n\r\n"
    head = (b"POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nInference-Header-Content-Length: %d"
            b"\r\n\r\n" % (INFER, header_length))
    with connect(server) as sock:
        sender = send_in_background(sock, head + chunks)
        answer = outputs_of(Reader(sock).response())
        sender.join()
    assert np.allclose(answer, mlp_reference(WEIGHTS, x), atol=1e-4)


def test_expect_100_continue_is_answered_before_a_large_body_is_sent(server: RunningServer) -> None:
    x = frame(2000, 4)
    body, header_length = binary_body(x)
    whole = request(body, header_length, b"Expect: 100-continue\r\n")
    head, _, _ = whole.partition(b"\r\n\r\n")
    with connect(server) as sock:
        sock.sendall(head + b"\r\n\r\n")
        assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sender = send_in_background(sock, body)
        answer = outputs_of(Reader(sock).response())
        sender.join()
    assert np.allclose(answer, mlp_reference(WEIGHTS, x), atol=1e-4)


def test_a_client_that_closes_inside_a_large_body_releases_its_budget(server: RunningServer) -> None:
    body, header_length = binary_body(frame(4000, 5))
    with connect(server) as sock:
        sock.sendall(request(body, header_length)[:600_000])  # the head and 0.6 of 1 MB declared
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(100) == b""  # nothing owed, nothing answered: the request never arrived
    deadline_polls = 500
    while held_body_bytes(server) and deadline_polls:  # released on connection_lost, on the loop thread
        deadline_polls -= 1
    assert held_body_bytes(server) == 0
    assert server.request("GET", "/v2/health/live")[0] == 200


def test_a_large_body_that_stops_arriving_gets_408_and_its_budget_back(server: RunningServer) -> None:
    body, header_length = binary_body(frame(4000, 6))
    with connect(server) as sock:
        sock.sendall(request(body, header_length)[:700_000])
        status, headers, reply = Reader(sock).response()  # request_timeout_s = 2 s
        assert status == 408 and b"did not arrive" in reply and headers["connection"] == "close"
        assert sock.recv(100) == b""
    assert held_body_bytes(server) == 0


def test_a_large_body_over_max_body_bytes_is_refused_before_it_is_read(tmp_path: Path) -> None:
    server = _server(tmp_path, max_body_bytes=2 << 20)
    try:
        with connect(server) as sock:  # 3 MiB declared, not one byte of it sent
            sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (INFER, 3 << 20))
            status, headers, reply = Reader(sock).response()
        assert status == 413 and headers["connection"] == "close" and b"limit of 2097152" in reply
        assert held_body_bytes(server) == 0
    finally:
        server.stop()


def test_two_large_bodies_in_flight_are_held_to_the_inflight_budget(tmp_path: Path) -> None:
    x = frame(4000, 7)
    body, header_length = binary_body(x)  # ~1 MB
    server = _server(tmp_path, max_body_bytes=len(body), max_inflight_body_bytes=len(body) + len(body) // 2)
    try:
        with connect(server) as slow, connect(server) as second:
            whole = request(body, header_length)
            slow.sendall(whole[:500_000])  # declared, half arrived: the whole declared length is held
            second.sendall(whole[:300])
            status, headers, reply = Reader(second).response()
            assert status == 503 and headers["retry-after"] == "1"
            assert b"server.max_inflight_body_bytes" in reply
            slow.sendall(whole[500_000:])
            assert np.allclose(outputs_of(Reader(slow).response()), mlp_reference(WEIGHTS, x), atol=1e-4)
        with connect(server) as third:
            sender = send_in_background(third, whole)
            assert np.allclose(outputs_of(Reader(third).response()), mlp_reference(WEIGHTS, x), atol=1e-4)
            sender.join()
        assert held_body_bytes(server) == 0
    finally:
        server.stop()


class LoopCallbacks:
    """Protocol callbacks made on the server's loop thread while ``recording`` is set."""

    def __init__(self) -> None:
        self.recording = False
        self.loop_thread: int | None = None
        self.calls: collections.Counter[str] = collections.Counter()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.recording or threading.get_ident() != self.loop_thread:
            return
        if event == "c_call":
            self.calls[getattr(arg, "__qualname__", str(arg))] += 1
        elif event == "call":
            self.calls[frame.f_code.co_name] += 1


def test_a_six_megabyte_body_costs_the_parser_one_read_not_one_per_read(tmp_path: Path) -> None:
    feeds = LoopCallbacks()
    threading.setprofile(feeds)  # reaches the server's loop thread, which the server starts
    try:
        server = _server(tmp_path)
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
    feeds.loop_thread = server._thread.ident
    x = frame(24_300, 8)  # 6.2 MB of FP32, a camera frame's size
    body, header_length = binary_body(x)
    try:
        with connect(server) as sock:
            feeds.recording = True
            sender = send_in_background(sock, request(body, header_length))
            answer = outputs_of(Reader(sock).response())
            feeds.recording = False
            sender.join()
    finally:
        server.stop()
    assert np.allclose(answer, mlp_reference(WEIGHTS, x), atol=1e-4)
    calls = feeds.calls
    # Through the parser the body took a data_received, a feed and an on_body per read: at least 25 reads of
    # uvloop's 250 KB, ~1,160 of ~5.4 KiB from a client in another process (docs/benchmarks.md).
    assert calls["data_received"] == 1 and calls["on_body"] <= 1, calls.most_common(12)
    assert calls["buffer_updated"] >= 1, calls.most_common(12)


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_heads_that_declare_large_bodies_hold_budget_but_no_memory(tmp_path: Path) -> None:
    declared, count = 15 << 20, 8  # 120 MiB declared, not one byte of body sent
    server = _server(tmp_path, max_body_bytes=16 << 20, max_inflight_body_bytes=count * (16 << 20))
    socks: list[socket.socket] = []
    try:
        before = _rss_bytes()  # the server runs in this process (a loop thread)
        for _ in range(count):
            sock = connect(server)
            sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (INFER, declared))
            socks.append(sock)
        polls = 1000
        while held_body_bytes(server) < count * declared and polls:
            polls -= 1
        assert held_body_bytes(server) == count * declared  # each head reserved its length
        assert _rss_bytes() - before < 32 << 20, "the bodies' buffers were allocated before their first byte"
    finally:
        for sock in socks:
            sock.close()
        server.stop()

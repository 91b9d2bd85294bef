"""Abusive shapes and sizes against the live server: every request gets an answer, nothing leaks."""

from __future__ import annotations

import json
import socket
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import orjson
from conftest import RunningServer, make_server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from modelgen import add_model, mlp_reference, mlp_weights

from edged.cli.status import describe
from edged.config import ServerConfig

INFER = "/v2/models/tiny_mlp/infer"
SHAPES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Dimensions that break naive element counting: zeros next to huge values, negatives, products past int64.
_dims = st.one_of(st.sampled_from([0, 1, 64, -1, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1]),
                  st.integers(-3, 70), st.integers(2**30, 2**70))


def exchange(server: RunningServer, data: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(server.socket_path))
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def post(server: RunningServer, body: bytes, header_length: int | None = None) -> tuple[int, dict[str, str]]:
    head = f"POST {INFER} HTTP/1.1\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
    if header_length is not None:
        head += f"Inference-Header-Content-Length: {header_length}\r\n"
    reply = exchange(server, head.encode() + b"\r\n" + body)
    assert reply.startswith(b"HTTP/1.1 "), reply[:200]
    return int(reply.split(b" ", 2)[1]), orjson.loads(reply.split(b"\r\n\r\n", 1)[1])


def test_a_zero_dimension_beside_huge_ones_gets_an_answer(server: RunningServer) -> None:
    body = b'{"inputs":[{"name":"input","datatype":"FP32","shape":[4294967296,4294967296,0],"data":[]}]}'
    status, doc = post(server, body)
    assert status == 413 and "4294967296" in doc["error"]
    assert server.server is not None and server.server.active_requests == 0


@SHAPES
@given(shape=st.lists(_dims, max_size=5), binary=st.booleans())
def test_any_shape_gets_a_clear_answer_and_leaks_no_request(server: RunningServer, shape: list[int],
                                                            binary: bool) -> None:
    tensor: dict[str, object] = {"name": "input", "datatype": "FP32", "shape": shape}
    if binary:
        tensor["parameters"] = {"binary_data_size": 0}
    else:
        tensor["data"] = []
    body = json.dumps({"inputs": [tensor]}).encode()  # stdlib: integers past 64 bits are part of the test
    status, doc = post(server, body, len(body) if binary else None)
    assert status in (200, 400, 413), doc
    if status != 200:
        assert "input" in doc["error"]
    assert server.server is not None and server.server.active_requests == 0


def _open(server: RunningServer) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(server.socket_path))
    return sock


# Bytes read past a response, by socket (not by fd: numbers are reused): pipelined answers come together.
_PENDING: weakref.WeakKeyDictionary[socket.socket, bytes] = weakref.WeakKeyDictionary()


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = _PENDING.pop(sock, b"")
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers["content-length"])
    while len(body) < length:
        body += sock.recv(65536)
    if len(body) > length:
        _PENDING[sock] = body[length:]
    return int(lines[0].split(" ", 2)[1]), headers, body[:length]


def _live(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    return _read_response(sock)


def _wait_for_connections(server: RunningServer, count: int) -> None:
    deadline = time.monotonic() + 10
    while server.server is not None and server.server.connection_count != count:
        assert time.monotonic() < deadline, f"{server.server.connection_count} connections, expected {count}"
        time.sleep(0.01)


def test_past_max_connections_a_client_gets_503_with_retry_after(tmp_path: Path) -> None:
    server = make_server(tmp_path, max_connections=3)
    held = [_open(server) for _ in range(3)]
    try:
        assert all(_live(sock)[0] == 200 for sock in held)
        with _open(server) as extra:
            status, headers, body = _read_response(extra)
            assert extra.recv(1) == b""  # closed after the answer, not reset
        assert status == 503 and headers["retry-after"] == "1" and headers["connection"] == "close"
        assert "server.max_connections" in orjson.loads(body)["error"]
        held.pop().close()
        _wait_for_connections(server, 2)
        with _open(server) as again:
            assert _live(again)[0] == 200
            status_doc = orjson.loads(_get(again, "/v2/edged/status"))
        assert status_doc["limits"]["connections_refused"] == 1 and status_doc["limits"]["max_connections"] == 3
        assert any(line.startswith("sockets") and "of 3, refused 1" in line for line in describe(status_doc))
    finally:
        for sock in held:
            sock.close()
        server.stop()


def _get(sock: socket.socket, path: str) -> bytes:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    status, _, body = _read_response(sock)
    assert status == 200, body
    return body


def test_a_body_too_large_for_the_model_is_refused_before_it_is_sent(tmp_path: Path) -> None:
    server = make_server(tmp_path, max_body_bytes=64 << 20)
    try:
        with _open(server) as sock:  # 60 MB of JSON declared, not one byte of it sent
            sock.sendall(f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: 60000000\r\n\r\n".encode())
            status, headers, body = _read_response(sock)
        assert status == 413 and headers["connection"] == "close"
        assert "tiny_mlp" in orjson.loads(body)["error"]
        assert server.server is not None and server.server.active_requests == 0
    finally:
        server.stop()


def test_bodies_past_the_inflight_budget_get_503_until_the_budget_frees(tmp_path: Path) -> None:
    server = make_server(tmp_path, max_body_bytes=1 << 20, max_inflight_body_bytes=(1 << 20) + (1 << 19))
    index = b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
    try:
        slow = _open(server)
        slow.sendall(index % (1 << 20) + b" " * 1000)  # a megabyte declared, arriving slowly
        with _open(server) as second:
            second.sendall(index % (1 << 20))
            status, headers, body = _read_response(second)
        assert status == 503 and headers["retry-after"] == "1"
        assert "server.max_inflight_body_bytes" in orjson.loads(body)["error"]
        slow.sendall(b" " * ((1 << 20) - 1002) + b"{}")
        assert _read_response(slow)[0] == 200
        slow.close()
        with _open(server) as third:
            third.sendall(index % (1 << 20) + b" " * ((1 << 20) - 2) + b"{}")
            assert _read_response(third)[0] == 200
    finally:
        server.stop()


OPEN_MLP = """name: "open_mlp"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "input", data_type: TYPE_FP32, dims: [ -1, 64 ] } ]
output [ { name: "output", data_type: TYPE_FP32, dims: [ -1, 10 ] } ]
"""


def test_a_large_json_body_is_decoded_off_the_loop_and_answered_in_order(tmp_path: Path) -> None:
    weights = mlp_weights()
    add_model(tmp_path / "repo", "open_mlp", OPEN_MLP, {1: weights})
    server = RunningServer(tmp_path / "repo", ServerConfig(), tmp_path / "edged.sock")
    rows = 3000  # about 2.4 MB of JSON: past the size decoded in the executor
    x = np.random.default_rng(1).standard_normal((rows, 64)).astype(np.float32)
    good = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [rows, 64],
                                     "data": x.ravel().tolist()}]})
    bad = good[:-200] + good[-200:].replace(b",", b" ", 1)  # two numbers without a comma between
    path = b"/v2/models/open_mlp/infer"
    request = b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
    try:
        with _open(server) as sock:  # pipelined: the large decodes run in the executor, the answers keep order
            # Sent from a thread while this one reads: a client that does not read its responses is not read
            # from either (back-pressure), and the first answer can come before the last request is sent.
            sender = threading.Thread(target=sock.sendall, args=(
                request % (path, len(good)) + good + request % (path, len(bad)) + bad
                + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n",))
            sender.start()
            first, second, third = (_read_response(sock) for _ in range(3))
            sender.join()
        assert first[0] == 200 and second[0] == 400 and third[0] == 200
        output = orjson.loads(first[2])["outputs"][0]
        assert output["shape"] == [rows, 10]
        assert np.allclose(np.asarray(output["data"]).reshape(rows, 10), mlp_reference(weights, x), atol=1e-4)
        assert "numbers" in orjson.loads(second[2])["error"]
        assert server.server is not None and server.server.active_requests == 0
    finally:
        server.stop()


def test_a_large_body_that_does_not_fit_the_model_is_refused_before_its_data_is_read(tmp_path: Path) -> None:
    add_model(tmp_path / "repo", "open_mlp", OPEN_MLP, {1: mlp_weights()})
    server = RunningServer(tmp_path / "repo", ServerConfig(), tmp_path / "edged.sock")
    rows = 3000
    values = b",".join([b"0.123456"] * (rows * 63))
    # 63 columns where the model takes 64, and data that breaks only at its end: the shape error proves the
    # model's checks ran on the metadata before the data was parsed.
    body = (b'{"inputs":[{"name":"input","datatype":"FP32","shape":[%d,63],"data":[%s,oops]}]}'
            % (rows, values))
    try:
        with _open(server) as sock:
            sock.sendall(b"POST /v2/models/open_mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                         % len(body) + body)
            status, _, reply = _read_response(sock)
        assert status == 400 and "expected [-1, 64]" in orjson.loads(reply)["error"], reply
    finally:
        server.stop()


def test_past_max_connections_a_v1_request_gets_the_same_503_before_it_is_read(tmp_path: Path) -> None:
    # the README's promise: the refusal is written at accept, so /v1 gets edged's shape, not OpenAI's
    server = make_server(tmp_path, max_connections=1)
    held = _open(server)
    try:
        assert _live(held)[0] == 200
        with _open(server) as extra:
            extra.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-length: 2\r\n\r\n{}")
            status, headers, body = _read_response(extra)
        assert status == 503 and headers["retry-after"] == "1" and headers["connection"] == "close"
        assert isinstance(orjson.loads(body)["error"], str) and "server.max_connections" in body.decode()
    finally:
        held.close()
        server.stop()

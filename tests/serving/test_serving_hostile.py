"""Hostile and broken clients: each gets a clear 4xx and the server keeps serving everyone else."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
from conftest import RunningServer, make_server

from edged.protocol import encode_request

INFER = "/v2/models/tiny_mlp/infer"


def raw_exchange(server: RunningServer, data: bytes, timeout: float = 5.0) -> bytes:
    """Send ``data`` on a fresh connection and read until the server closes it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(server.socket_path))
        sock.sendall(data)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def assert_still_serving(server: RunningServer) -> None:
    assert server.request("GET", "/v2/health/live")[0] == 200


def infer_json(inputs: list[dict[str, object]]) -> bytes:
    return orjson.dumps({"inputs": inputs})


@pytest.mark.parametrize(("body", "headers", "fragment"), [
    (b"{not json", {}, "not valid JSON"),
    (b"[1, 2]", {}, "JSON object"),
    (b"{}", {}, "inputs"),
    (infer_json([{"name": "input", "datatype": "FP99", "shape": [1, 64], "data": [0] * 64}]), {}, "FP99"),
    (infer_json([{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0] * 63}]), {}, "63 values"),
    (infer_json([{"name": "wrong", "datatype": "FP32", "shape": [1, 64], "data": [0] * 64}]), {}, "input"),
    (infer_json([{"name": "input", "datatype": "FP32", "shape": [1, 64],
                  "parameters": {"binary_data_size": 256}}]) + b"\0" * 100,
     {"Inference-Header-Content-Length": "-"}, "Inference-Header-Content-Length"),
    (b"{}", {"Inference-Header-Content-Length": "9999"}, "Inference-Header-Content-Length"),
])
def test_bad_infer_bodies_are_400_with_a_message(server: RunningServer, body: bytes, headers: dict[str, str],
                                                 fragment: str) -> None:
    status, _, reply = server.request("POST", INFER, body, headers)
    assert status == 400, reply
    assert fragment.lower() in orjson.loads(reply)["error"].lower()
    assert_still_serving(server)


def test_binary_sizes_that_disagree_with_the_body_are_400(server: RunningServer) -> None:
    header = infer_json([{"name": "input", "datatype": "FP32", "shape": [1, 64],
                          "parameters": {"binary_data_size": 256}}])
    for extra in (100, 300):
        status, _, reply = server.request("POST", INFER, header + b"\0" * extra,
                                          {"Inference-Header-Content-Length": str(len(header))})
        assert status == 400 and "binary" in orjson.loads(reply)["error"]


def test_nan_is_refused_where_the_model_forbids_it(server: RunningServer) -> None:
    x = np.zeros((1, 64), np.float32)
    x[0, 3] = np.nan
    body, header_length = encode_request({"input": x})
    headers = {"Inference-Header-Content-Length": str(header_length)}
    status, _, reply = server.request("POST", "/v2/models/tiny_strict/infer", body, headers)
    assert status == 400 and "NaN or Inf" in orjson.loads(reply)["error"]
    assert server.request("POST", INFER, body, headers)[0] == 200  # tiny_mlp accepts it


def test_malformed_request_line_is_400_and_closes(server: RunningServer) -> None:
    reply = raw_exchange(server, b"GARBAGE\x01 / HTTP/1.1\r\n\r\n")
    assert status_of(reply) == 400 and b"connection: close" in reply
    assert_still_serving(server)


def test_huge_headers_are_431(server: RunningServer) -> None:
    reply = raw_exchange(server, b"GET /v2 HTTP/1.1\r\nX-Big: " + b"a" * 8000 + b"\r\n\r\n")
    assert status_of(reply) == 431
    assert_still_serving(server)


def test_body_over_the_limit_is_413_before_it_is_read(server: RunningServer) -> None:
    reply = raw_exchange(server, b"POST " + INFER.encode() + b" HTTP/1.1\r\nContent-Length: 5000000\r\n\r\n{")
    assert status_of(reply) == 413 and b"limit" in reply


def test_chunked_request_bodies_work(server: RunningServer) -> None:
    body = infer_json([{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [1] * 64}])
    half = len(body) // 2
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:half], body[half:])) + b"0\r\n\r\n"
    reply = raw_exchange(server, b"POST " + INFER.encode() + b" HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
                                 b"Connection: close\r\n\r\n" + chunks)
    assert status_of(reply) == 200 and b'"shape":[1,10]' in reply


def test_pipelined_requests_are_answered_in_order(server: RunningServer) -> None:
    bodies = [infer_json([{"name": "input", "datatype": "FP32", "shape": [n, 64], "data": [1] * 64 * n}])
              for n in (1, 2, 3)]
    data = b"".join(b"POST %s HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (INFER.encode(), len(b), b)
                    for b in bodies)
    data += b"GET /v2/models/ghost HTTP/1.1\r\n\r\nGET /v2 HTTP/1.1\r\nConnection: close\r\n\r\n"
    reply = raw_exchange(server, data)
    shapes = (b'"shape":[1,10]', b'"shape":[2,10]', b'"shape":[3,10]', b"ghost", b'"name":"edged"')
    positions = [reply.find(part) for part in shapes]
    assert all(p >= 0 for p in positions) and positions == sorted(positions)


def test_pipelined_infer_requests_that_arrive_together_share_a_batch(server: RunningServer) -> None:
    def counts() -> tuple[int, int]:
        doc = orjson.loads(server.request("GET", "/v2/models/tiny_strict/stats")[2])["model_stats"][0]
        return doc["inference_count"], doc["execution_count"]

    body = infer_json([{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [1] * 64}])
    request = b"POST /v2/models/tiny_strict/infer HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    inferences, executions = counts()
    reply = raw_exchange(server, request * 3 + request.replace(b"HTTP/1.1\r\n", b"HTTP/1.1\r\nConnection: close\r\n"))
    assert reply.count(b"HTTP/1.1 200 OK") == 4
    after_inferences, after_executions = counts()
    assert after_inferences - inferences == 4
    assert after_executions - executions < 4, "requests parsed from one read should run as one batch"


def test_truncated_body_times_out_with_408_while_others_are_served(server: RunningServer) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as slow:
        slow.settimeout(10)
        slow.connect(str(server.socket_path))
        slow.sendall(b"POST " + INFER.encode() + b" HTTP/1.1\r\nContent-Length: 1000\r\n\r\n{\"inp")
        started = time.monotonic()
        while time.monotonic() - started < 0.5:  # a second client is served while the first one stalls
            assert_still_serving(server)
        reply = slow.recv(65536)
        assert status_of(reply) == 408 and b"did not arrive" in reply
        assert slow.recv(100) == b""


def test_a_client_dribbling_bytes_does_not_stall_others(server: RunningServer) -> None:
    request = b"GET /v2/health/live HTTP/1.1\r\nConnection: close\r\n\r\n"
    result: list[bytes] = []

    def dribble() -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(str(server.socket_path))
            for byte in request:
                sock.sendall(bytes([byte]))
                time.sleep(0.005)
            result.append(sock.recv(1000))

    thread = threading.Thread(target=dribble)
    thread.start()
    served = 0
    while thread.is_alive():
        assert_still_serving(server)
        served += 1
    thread.join()
    assert served >= 5 and status_of(result[0]) == 200


def test_idle_connections_are_closed(tmp_path: Path) -> None:
    running = make_server(tmp_path, idle_timeout_s=0.2)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(running.socket_path))
            started = time.monotonic()
            assert sock.recv(10) == b""
            assert time.monotonic() - started < 3
    finally:
        running.stop()


def test_stop_finishes_requests_in_flight_and_refuses_new_connections(tmp_path: Path) -> None:
    running = make_server(tmp_path)
    conn = running.connection()
    conn.request("GET", "/v2")
    assert conn.getresponse().read()
    running.stop(timeout_s=1.0)
    assert running.server is not None and running.server.active_requests == 0
    with pytest.raises(OSError):
        running.request("GET", "/v2/health/live")

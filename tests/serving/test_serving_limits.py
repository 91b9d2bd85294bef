"""Abusive shapes and sizes against the live server: every request gets an answer, nothing leaks."""

from __future__ import annotations

import json
import socket

import orjson
from conftest import RunningServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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

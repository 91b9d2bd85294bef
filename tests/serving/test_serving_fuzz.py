"""Hypothesis against the live server: arbitrary paths, headers and infer bodies never get a 5xx, never hang,
and never stop the server from serving the next client."""

from __future__ import annotations

import json
import socket
from typing import Any

import orjson
from conftest import RunningServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

def _dumps(doc: Any) -> bytes:
    return json.dumps(doc).encode()  # stdlib: integers beyond 64 bits and NaN are part of the fuzzing


_segments = st.one_of(st.sampled_from(["v2", "models", "tiny_mlp", "versions", "1", "infer", "ready", "config",
                                       "stats", "repository", "index", "load", "unload", "..", "%2F", "%00",
                                       "%ff", "edged", "status", "", "metrics"]),
                      st.text(alphabet="abc%2F0.-_~", max_size=8))
_tensor = st.fixed_dictionaries({
    "name": st.sampled_from(["input", "x", ""]),
    "datatype": st.sampled_from(["FP32", "FP16", "INT64", "BYTES", "BOOL", "FP99", ""]),
    "shape": st.lists(st.integers(-2, 70), max_size=3),
}, optional={
    "data": st.one_of(st.lists(st.one_of(st.floats(allow_nan=True), st.integers(-2**70, 2**70),
                                         st.text(max_size=3), st.booleans(), st.none()), max_size=70),
                      st.integers(), st.text(max_size=5)),
    "parameters": st.dictionaries(st.sampled_from(["binary_data_size", "x"]),
                                  st.one_of(st.integers(-5, 300), st.text(max_size=3)), max_size=2),
})
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                     max_leaves=10)
_body = st.one_of(
    st.builds(lambda inputs, extra: _dumps({"inputs": inputs, **extra}), st.lists(_tensor, max_size=3),
              st.dictionaries(st.sampled_from(["outputs", "parameters", "id"]), _json, max_size=2)),
    st.builds(_dumps, _json),
    st.binary(max_size=300),
)


def _exchange(server: RunningServer, data: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(str(server.socket_path))
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


@FUZZ
@given(segments=st.lists(_segments, min_size=1, max_size=6), method=st.sampled_from(["GET", "POST", "PUT", "HEAD"]))
def test_arbitrary_paths_never_get_a_server_error(server: RunningServer, segments: list[str], method: str) -> None:
    path = "/" + "/".join(segments)
    reply = _exchange(server, f"{method} {path} HTTP/1.1\r\nConnection: close\r\n\r\n".encode())
    assert reply.startswith(b"HTTP/1.1 ")
    status = int(reply.split(b" ", 2)[1])
    assert status < 500 or status == 503, reply[:300]


@FUZZ
@given(body=_body, header_length=st.one_of(st.none(), st.integers(-1, 400), st.text(max_size=4)),
       model=st.sampled_from(["tiny_mlp", "tiny_strict", "ghost"]))
def test_arbitrary_infer_bodies_get_a_clear_answer(server: RunningServer, body: bytes, header_length: object,
                                                   model: str) -> None:
    head = f"POST /v2/models/{model}/infer HTTP/1.1\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
    if header_length is not None:
        head += f"Inference-Header-Content-Length: {header_length}\r\n"
    reply = _exchange(server, head.encode("utf-8", "replace") + b"\r\n" + body)
    status = int(reply.split(b" ", 2)[1])
    assert status in (200, 400, 404, 413), reply[:400]
    if status != 200:
        assert orjson.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]


@FUZZ
@given(headers=st.lists(st.tuples(st.text(alphabet="abcXYZ-:_ \t", min_size=0, max_size=10),
                                  st.binary(max_size=30)), max_size=5))
def test_arbitrary_headers_never_break_the_server(server: RunningServer, headers: list[tuple[str, bytes]]) -> None:
    raw = b"".join(name.encode() + b": " + value.replace(b"\r", b"").replace(b"\n", b"") + b"\r\n"
                   for name, value in headers)
    reply = _exchange(server, b"GET /v2 HTTP/1.1\r\n" + raw + b"Connection: close\r\n\r\n")
    status = int(reply.split(b" ", 2)[1])
    assert status in (200, 400, 411, 413, 431), reply[:300]
    assert server.request("GET", "/v2/health/live")[0] == 200

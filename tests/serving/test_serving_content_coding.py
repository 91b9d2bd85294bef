"""Compressed request bodies (Content-Encoding gzip and deflate) over a real server: tritonclient.http's
``request_compression_algorithm`` over loopback TCP, raw requests over the Unix socket, a zip bomb, a corrupt
stream, and the codings that are refused by name."""

from __future__ import annotations

import gzip
import os
import socket
import zlib

import numpy as np
import orjson
import pytest
import tritonclient.http as triton_http
from conftest import RunningServer
from tritonclient.utils import InferenceServerException

INFER = "/v2/models/tiny_mlp/infer"
X = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
JSON_BODY = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64],
                                       "data": X.ravel().tolist()}]})


def _outputs(body: bytes) -> list[float]:
    data: list[float] = orjson.loads(body)["outputs"][0]["data"]
    return data


@pytest.fixture(scope="module")
def reference(server: RunningServer) -> list[float]:
    status, _, body = server.request("POST", INFER, JSON_BODY)
    assert status == 200, body
    return _outputs(body)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_compressed_requests_are_decoded(server: RunningServer, reference: list[float],
                                                      algorithm: str, binary: bool) -> None:
    client = triton_http.InferenceServerClient(f"127.0.0.1:{server.tcp_port}")
    try:
        x = triton_http.InferInput("input", [1, 64], "FP32")
        x.set_data_from_numpy(X, binary_data=binary)
        out = triton_http.InferRequestedOutput("output", binary_data=binary)
        result = client.infer("tiny_mlp", [x], outputs=[out], request_compression_algorithm=algorithm,
                              response_compression_algorithm=algorithm)  # Accept-Encoding: answered uncoded
        answer = result.as_numpy("output")
    finally:
        client.close()
    assert answer is not None and np.allclose(answer.ravel(), reference, atol=1e-6)


def _raw(server: RunningServer, head: bytes, body: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(server.socket_path))
        sock.sendall(head + b"\r\n" + body)
        received = b""
        while piece := sock.recv(65536):
            received += piece
    return received


def _chunked(body: bytes, size: int = 1000) -> bytes:
    pieces = [b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size]) for i in range(0, len(body), size)]
    return b"".join(pieces) + b"0\r\n\r\n"


def test_coded_json_bodies_are_decoded_with_a_length_chunked_or_as_raw_deflate(server: RunningServer,
                                                                               reference: list[float]) -> None:
    raw_deflate = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    bodies = {"gzip": gzip.compress(JSON_BODY),
              "x-gzip": gzip.compress(JSON_BODY[:100]) + gzip.compress(JSON_BODY[100:]),  # two gzip members
              "deflate": raw_deflate.compress(JSON_BODY) + raw_deflate.flush(),
              "identity": JSON_BODY}
    for coding, body in bodies.items():
        status, _, answer = server.request("POST", INFER, body, {"Content-Encoding": coding})
        assert status == 200, (coding, answer)
        assert np.allclose(_outputs(answer), reference, atol=1e-6)
    answer = _raw(server, b"POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Encoding: GZIP\r\n"
                          b"Transfer-Encoding: chunked\r\n" % INFER.encode(), _chunked(gzip.compress(JSON_BODY)))
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    assert np.allclose(_outputs(answer.split(b"\r\n\r\n", 1)[1]), reference, atol=1e-6)


def test_a_large_coded_body_read_past_the_parser_is_decoded(server: RunningServer,
                                                           reference: list[float]) -> None:
    # hex text compresses to about half: a compressed body over LARGE_BODY_BYTES goes to the BodyReader
    document = orjson.loads(JSON_BODY)
    document["parameters"] = {"padding": os.urandom(300_000).hex()}
    body = gzip.compress(orjson.dumps(document))
    assert 256 * 1024 < len(body) < (1 << 20)
    status, _, answer = server.request("POST", INFER, body, {"Content-Encoding": "gzip"})
    assert status == 200, answer[:300]
    assert np.allclose(_outputs(answer), reference, atol=1e-6)


def test_a_zip_bomb_gets_413_naming_the_limit(server: RunningServer) -> None:
    bomb = gzip.compress(b"[" * (64 << 20), 9)  # 64 MiB in ~64 KB; the server's max_body_bytes is 1 MiB
    status, headers, answer = server.request("POST", INFER, bomb, {"Content-Encoding": "gzip"})
    assert status == 413 and headers["connection"] == "close"
    assert b"decodes to more than the limit of 1048576 bytes" in answer and b"max_body_bytes" in answer
    assert server.request("GET", "/v2/health/live")[0] == 200


def test_tritonclient_over_the_limit_once_decoded_gets_413(server: RunningServer) -> None:
    client = triton_http.InferenceServerClient(f"127.0.0.1:{server.tcp_port}")
    try:
        x = triton_http.InferInput("input", [4096, 64], "FP32")  # 1 MiB of zeros: a few KB once compressed
        x.set_data_from_numpy(np.zeros((4096, 64), np.float32))
        with pytest.raises(InferenceServerException) as refused:
            client.infer("tiny_mlp", [x], request_compression_algorithm="gzip")
    finally:
        client.close()
    assert refused.value.status() == "413" and "Content-Encoding gzip" in str(refused.value)


@pytest.mark.parametrize(("coding", "body", "status", "words"), [
    ("gzip", b"\x1f\x8b\x08\x00 not a gzip stream", 400, b"not valid Content-Encoding gzip data"),
    ("gzip", gzip.compress(JSON_BODY)[:-20], 400, b"ends inside its compressed stream"),
    ("deflate", zlib.compress(JSON_BODY) + b"tail", 400, b"4 bytes after the end of its compressed stream"),
    ("deflate", JSON_BODY, 400, b"not valid Content-Encoding deflate data"),
    ("br", JSON_BODY, 415, b"Content-Encoding 'br' is not supported"),
    ("gzip, gzip", gzip.compress(gzip.compress(JSON_BODY)), 415, b"Content-Encoding 'gzip, gzip'"),
])
def test_bad_or_unknown_codings_are_refused_by_name(server: RunningServer, coding: str, body: bytes, status: int,
                                                    words: bytes) -> None:
    got, headers, answer = server.request("POST", INFER, body, {"Content-Encoding": coding})
    assert got == status and words in answer, answer
    if status == 415:
        assert headers["accept-encoding"] == "gzip, deflate"


def test_a_transfer_coding_before_chunked_is_refused_by_name(server: RunningServer) -> None:
    # httptools frames "gzip, chunked" as chunked and would hand on the body still gzip-coded
    answer = _raw(server, b"POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n" % INFER.encode(),
                  _chunked(gzip.compress(JSON_BODY)))
    assert answer.startswith(b"HTTP/1.1 501"), answer[:300]
    assert b"Transfer-Encoding 'gzip, chunked' is not supported" in answer

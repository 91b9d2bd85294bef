"""A request head repeated byte for byte on one connection skips the parser; anything else is parsed in full.

The server runs on a real Unix socket and loopback TCP; the parser's callbacks are counted on the server's loop
thread (the profile hook of test_serving_hot_path), which is how a test can tell a replayed head from a
parsed one. Every answer is checked against what the model computes for that body.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from conftest import RunningServer, make_server
from test_serving_hot_path import LoopCalls

from edged.config import ModelsConfig
from edged.engine import InferRequest, InferResponse
from edged.protocol import DecodedRequest, decode_response, encode_request, encode_response
from edged.serving._repeat import learn
from edged.serving._response_heads import ResponseHeads

KEY = "s3cret-value"


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, LoopCalls]]:
    calls = LoopCalls()
    threading.setprofile(calls)
    try:
        running = make_server(tmp_path_factory.mktemp("repeat"), tcp_restricted={"inference": f"edged-key={KEY}"},
                              models=ModelsConfig(control_mode="explicit", startup_models=("*",)))
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
    calls.loop_thread = running._thread.ident
    yield running, calls
    running.stop()


def _head(body: bytes, header_length: int, model: str = "tiny_mlp", extra: bytes = b"") -> bytes:
    return (b"POST /v2/models/%s/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/octet-stream\r\n"
            b"content-length: %d\r\ninference-header-content-length: %d\r\n%s\r\n"
            % (model.encode(), len(body), header_length, extra))


def _body(seed: int) -> tuple[bytes, int, np.ndarray]:
    data = np.random.default_rng(seed).random((1, 64), np.float32)
    body, header_length = encode_request({"input": data})
    assert header_length is not None
    return body, header_length, data


def _read_response(sock: socket.socket, pending: bytearray) -> tuple[int, dict[bytes, bytes], bytes]:
    while b"\r\n\r\n" not in pending:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection; it had sent {bytes(pending)!r}"
        pending += chunk
    head, _, rest = bytes(pending).partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    fields = {name.lower(): value for name, value in (line.split(b": ", 1) for line in lines[1:])}
    length = int(fields[b"content-length"])
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection inside a response"
        rest += chunk
    pending[:] = rest[length:]
    return int(lines[0].split(b" ")[1]), fields, rest[:length]


def _output(fields: dict[bytes, bytes], body: bytes) -> np.ndarray:
    _, outputs = decode_response(body, int(fields[b"inference-header-content-length"]))
    return outputs["output"]


def _reference(running: RunningServer, data: np.ndarray) -> np.ndarray:
    return running.service.infer(InferRequest("tiny_mlp", {"input": data})).outputs["output"]


def _connect(running: RunningServer, tcp: bool = False) -> socket.socket:
    if tcp:
        sock = socket.create_connection(("127.0.0.1", running.tcp_port), timeout=10)
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(str(running.socket_path))
    return sock


def _parsed(calls: LoopCalls) -> int:
    return calls.python["_http.py:on_message_begin"]


def test_identical_heads_skip_the_parser_and_each_body_gets_its_own_answer(
        counted: tuple[RunningServer, LoopCalls]) -> None:
    running, calls = counted
    with _connect(running) as sock:
        pending = bytearray()
        first, header_length, data = _body(1)
        sock.sendall(_head(first, header_length) + first)  # parsed, and its head remembered
        status, fields, reply = _read_response(sock, pending)
        assert status == 200 and np.allclose(_output(fields, reply), _reference(running, data))
        calls.python.clear()
        calls.recording = True
        answers = []
        for seed in (2, 3, 4):
            body, same_length, data = _body(seed)
            assert same_length == header_length
            sock.sendall(_head(body, header_length) + body)
            status, fields, reply = _read_response(sock, pending)
            answers.append((status, _output(fields, reply), data))
        calls.recording = False
    assert _parsed(calls) == 0, "a head seen before on this connection was parsed again"
    for status, output, data in answers:
        assert status == 200 and np.allclose(output, _reference(running, data))
    assert not np.array_equal(answers[0][1], answers[1][1])


@pytest.mark.parametrize("variant", ["another model", "another length", "another header value", "closing"])
def test_a_head_that_differs_in_one_place_is_parsed_and_judged_on_its_own_bytes(
        counted: tuple[RunningServer, LoopCalls], variant: str) -> None:
    running, calls = counted
    body, header_length, data = _body(5)
    nan = np.full((1, 64), np.nan, np.float32)
    nan_body, _ = encode_request({"input": nan})
    with _connect(running) as sock:
        pending = bytearray()
        for _ in range(2):  # learned, then replayed
            sock.sendall(_head(nan_body, header_length) + nan_body)
            assert _read_response(sock, pending)[0] == 200  # tiny_mlp takes NaN; tiny_strict refuses it
        calls.python.clear()
        calls.recording = True
        if variant == "another model":  # same length, one other byte in the request line
            sock.sendall(_head(nan_body, header_length, "tiny_mlq") + nan_body)
            status, _, reply = _read_response(sock, pending)
            assert status == 404 and b"tiny_mlq" in reply
            sock.sendall(_head(nan_body, header_length, "tiny_strict") + nan_body)
            status, _, reply = _read_response(sock, pending)
            assert status == 400 and b"NaN" in reply
        elif variant == "another length":  # the body is 64 bytes longer than the head before declared
            longer = nan_body + b"\0" * 64
            sock.sendall(_head(longer, header_length) + longer)
            status, _, reply = _read_response(sock, pending)
            assert status == 400 and b"binary" in reply.lower()
        elif variant == "another header value":  # the JSON header's length, one digit changed
            sock.sendall(_head(nan_body, header_length + 1) + nan_body)
            status, _, reply = _read_response(sock, pending)
            assert status == 400
        else:
            sock.sendall(_head(body, header_length, extra=b"connection: close\r\n") + body)
            status, fields, reply = _read_response(sock, pending)
            assert status == 200 and fields[b"connection"] == b"close"
            assert np.allclose(_output(fields, reply), _reference(running, data))
            assert sock.recv(65536) == b""
        calls.recording = False
    assert _parsed(calls) >= 1


def test_a_header_that_decides_access_is_judged_per_request_over_tcp(
        counted: tuple[RunningServer, LoopCalls]) -> None:
    running, _ = counted
    body, header_length, data = _body(6)
    good = _head(body, header_length, extra=f"edged-key: {KEY}\r\n".encode()) + body
    wrong = _head(body, header_length, extra=f"edged-key: {KEY.upper()}\r\n".encode()) + body  # same length
    assert len(good) == len(wrong)
    with _connect(running, tcp=True) as sock:
        pending = bytearray()
        for _ in range(3):
            sock.sendall(good)
            status, fields, reply = _read_response(sock, pending)
            assert status == 200 and np.allclose(_output(fields, reply), _reference(running, data))
        sock.sendall(wrong)
        status, _, reply = _read_response(sock, pending)
        assert status == 403
        sock.sendall(good)
        assert _read_response(sock, pending)[0] == 200


def test_pipelined_and_split_repeats_are_answered_in_order(counted: tuple[RunningServer, LoopCalls]) -> None:
    running, _ = counted
    requests = []
    for seed in range(10, 16):
        body, header_length, data = _body(seed)
        requests.append((_head(body, header_length) + body, data, len(_head(body, header_length))))
    with _connect(running) as sock:
        pending = bytearray()
        sock.sendall(requests[0][0])
        assert _read_response(sock, pending)[0] == 200
        # two whole requests in one send, then one split at its head, then one dribbled in three pieces,
        # the last piece carrying the start of the next request
        raw0, raw1, raw2, raw3, raw4 = (r[0] for r in requests[1:])
        head_length = requests[1][2]
        sends = [raw0 + raw1, raw2[:head_length], raw2[head_length:], raw3[:10], raw3[10:head_length + 7],
                 raw3[head_length + 7:] + raw4[:head_length], raw4[head_length:]]
        for piece in sends:
            sock.sendall(piece)
        for _, data, _ in requests[1:]:
            status, fields, reply = _read_response(sock, pending)
            assert status == 200 and np.allclose(_output(fields, reply), _reference(running, data))


def _wait_for_reads(calls: LoopCalls, count: int) -> None:
    """Until the server's loop has handled ``count`` reads since recording began (readiness, not timing)."""
    deadline = time.monotonic() + 10
    while calls.python["_http.py:data_received"] < count:
        assert time.monotonic() < deadline, "the server did not read what was sent"
        time.sleep(0.005)


def test_a_repeated_head_that_arrives_alone_is_completed_by_its_body(
        counted: tuple[RunningServer, LoopCalls]) -> None:
    running, calls = counted
    requests = [_body(seed) for seed in (20, 21, 22, 23)]
    with _connect(running) as sock:
        pending = bytearray()
        body, header_length, _ = requests[0]
        sock.sendall(_head(body, header_length) + body)
        assert _read_response(sock, pending)[0] == 200
        calls.python.clear()
        calls.recording = True
        body, _, data = requests[1]
        sock.sendall(_head(body, header_length))
        _wait_for_reads(calls, 1)
        sock.sendall(body)
        status, fields, reply = _read_response(sock, pending)
        replayed = _parsed(calls) == 0
        # the head alone again, then half its body, then the rest with the next whole request behind it
        body, _, second = requests[2]
        sock.sendall(_head(body, header_length))
        _wait_for_reads(calls, 3)
        sock.sendall(body[:40])
        _wait_for_reads(calls, 4)
        following, _, third = requests[3]
        sock.sendall(body[40:] + _head(following, header_length) + following)
        answers = [_read_response(sock, pending) for _ in range(2)]
        calls.recording = False
    assert replayed, "a repeated head that came before its body was parsed"
    assert status == 200 and np.allclose(_output(fields, reply), _reference(running, data))
    for (status, fields, reply), expected in zip(answers, (second, third), strict=True):
        assert status == 200 and np.allclose(_output(fields, reply), _reference(running, expected))


def test_a_smuggling_variant_of_a_remembered_head_is_refused(counted: tuple[RunningServer, LoopCalls]) -> None:
    running, _ = counted
    body, header_length, _ = _body(7)
    smuggled = b"GET /v2/health/ready HTTP/1.1\r\nhost: x\r\n\r\n"
    with _connect(running) as sock:
        pending = bytearray()
        for _ in range(2):
            sock.sendall(_head(body, header_length) + body)
            assert _read_response(sock, pending)[0] == 200
        # the same head with Transfer-Encoding added: a body framed two ways, behind it a second request
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        sock.sendall(_head(body, header_length, extra=b"transfer-encoding: chunked\r\n") + chunked + smuggled)
        status, fields, _ = _read_response(sock, pending)
        assert status == 400 and fields[b"connection"] == b"close"
        rest = bytes(pending)
        while chunk := sock.recv(65536):
            rest += chunk
        assert rest == b"", "a request smuggled behind the refused one was answered"


@pytest.mark.parametrize(("data", "why"), [
    (b"POST / HTTP/1.1\r\ncontent-length: 2\r\n\r\nab", None),
    (b"\r\nPOST / HTTP/1.1\r\ncontent-length: 2\r\n\r\nab", "an empty line before the request"),
    (b"POST / HTTP/1.1\r\ncontent-length: 2\r\n\r\nab\r\n", "bytes after the body"),
    (b"POST / HTTP/1.1\r\ncontent-length: 2\r\nx: a\n\r\n\r\nab", "a bare LF in the head"),
])
def test_only_a_read_that_frames_exactly_one_request_is_learned(data: bytes, why: str | None) -> None:
    repeat = learn(data, b"POST", b"/", {b"content-length": b"2"}, b"ab", True)
    if why is None:
        assert repeat is not None and repeat.head == data[:-2] and repeat.total == len(data)
    else:
        assert repeat is None, why


def test_heads_that_cannot_be_replayed_are_not_learned() -> None:
    data = b"POST / HTTP/1.1\r\ncontent-length: 2\r\n\r\nab"
    assert learn(data, b"POST", b"/", {b"content-length": b"2"}, b"ab", False) is None  # not keep-alive
    assert learn(data, b"POST", b"/", {b"content-length": b"2", b"expect": b"100-continue"}, b"ab", True) is None
    assert learn(data, b"POST", b"/", {}, b"ab", True) is None  # chunked: no Content-Length
    assert learn(data, b"POST", b"/", {b"content-length": b"2,2"}, b"ab", True) is None


def _encoded_in_full(result: InferResponse, decoded: DecodedRequest, keep_alive: bool) -> bytes:
    body, header_length = encode_response(result, decoded.binary_outputs, decoded.binary_default)
    close = b"" if keep_alive else b"connection: close\r\n"
    if header_length is None:
        return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
            len(body), close, body)
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: %d\r\n"
            b"inference-header-content-length: %d\r\n%s\r\n%s" % (len(body), header_length, close, body))


@pytest.mark.parametrize(("outputs", "decoded", "cached"), [
    ({"output": np.float32}, DecodedRequest({}, binary_default=True), True),
    ({"a": np.int64, "b": np.float16}, DecodedRequest({}, binary_outputs={"a": True, "b": True}), True),
    ({"output": np.float32}, DecodedRequest({}, binary_default=False), False),  # JSON data: varies
    ({"output": np.float32}, DecodedRequest({}, id="r1", binary_default=True), False),
    ({"output": np.dtype(">f4")}, DecodedRequest({}, binary_default=True), False),  # byte-swapped on the wire
])
def test_a_repeated_response_layout_gives_the_bytes_a_full_encode_gives(
        outputs: dict[str, np.dtype[np.generic]], decoded: DecodedRequest, cached: bool) -> None:
    heads = ResponseHeads()
    rng = np.random.default_rng(0)
    for keep_alive in (True, False, True):
        for _ in range(2):
            arrays = {name: (rng.random((2, 3)) * 100).astype(dtype) for name, dtype in outputs.items()}
            result = InferResponse("m", "1", arrays, decoded.id)
            assert heads.encode(result, decoded, keep_alive, frozenset()) == _encoded_in_full(result, decoded,
                                                                                             keep_alive)
    assert len(heads) == (2 if cached else 0)


def test_a_cached_response_of_arrays_not_in_row_major_memory_gives_their_row_major_bytes() -> None:
    # the cached path hands C-contiguous arrays to bytes.join as they are; the others must still be row-major
    heads = ResponseHeads()
    decoded = DecodedRequest({}, binary_default=True)
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    for arrays in ({"output": base}, {"output": np.ascontiguousarray(base.T)}, {"output": base.T},
                   {"output": np.asfortranarray(base.T)}, {"output": base.T[::2]}):
        result = InferResponse("m", "1", arrays, "")
        for _ in range(2):  # the second is answered from the cached head
            assert heads.encode(result, decoded, True, frozenset()) == _encoded_in_full(result, decoded, True)
    assert len(heads) == 3  # shapes (3, 4), (4, 3) and (2, 3)

"""What edged reuses between calls on one connection (decoded headers, a request's and a response's layout) never
carries a decision or a tensor from one call to another: raw frames over a real socket to the spawned daemon,
each answer checked against what that call alone must get."""

from __future__ import annotations

import numpy as np
import pytest
from grpcapi_daemon import SHM_KEY, GrpcDaemon
from h2_raw import DATA, END_HEADERS, END_STREAM, HEADERS, RawH2, frame, message, request_block

from edged.grpcapi._grpc_stream import _HEADS, RequestHeads
from edged.grpcapi.proto import grpc_service_pb2 as pb

OK, PERMISSION_DENIED = b"0", b"7"


def _short(value: bytes) -> bytes:
    return bytes((len(value),)) + value  # an HPACK string literal of under 127 bytes, no Huffman


def _pseudo(method: str) -> bytes:
    """The request's own headers as literals without indexing (they leave the dynamic table alone)."""
    return request_block(method)


def _insert(name: bytes, value: bytes) -> bytes:
    """A literal with incremental indexing and a new name: it becomes dynamic entry 62 (RFC 7541 §6.2.1)."""
    return b"\x40" + _short(name) + _short(value)


_DYNAMIC_62 = b"\xbe"  # an indexed field naming dynamic entry 62: whatever was inserted last


def _status(client: RawH2, stream: int, block: bytes) -> bytes:
    body = pb.SystemSharedMemoryStatusRequest().SerializeToString()
    client.send(frame(HEADERS, END_HEADERS, stream, block), frame(DATA, END_STREAM, stream, message(body)))
    fields, _ = client.response(stream)
    return fields[b"grpc-status"]


def test_a_repeated_header_block_is_judged_again_once_the_table_it_names_has_changed(
        grpc_daemon: GrpcDaemon) -> None:
    key, secret = (part.encode() for part in SHM_KEY)
    method = "SystemSharedMemoryStatus"  # refused over TCP without the [server.tcp_restricted] key
    with RawH2(grpc_daemon.tcp) as client:
        client.start()
        assert _status(client, 1, _pseudo(method) + _insert(key, secret)) == OK
        assert _status(client, 3, _pseudo(method) + _DYNAMIC_62) == OK
        assert _status(client, 5, _pseudo(method) + _DYNAMIC_62) == OK  # the same bytes, the same table
        assert _status(client, 7, _pseudo(method) + _insert(key, b"wrong")) == PERMISSION_DENIED
        # byte for byte the block that was admitted twice above; entry 62 is now the wrong key
        assert _status(client, 9, _pseudo(method) + _DYNAMIC_62) == PERMISSION_DENIED
        assert _status(client, 11, _pseudo(method)) == PERMISSION_DENIED
        assert _status(client, 13, _pseudo(method) + _insert(key, secret)) == OK


def test_repeated_identical_headers_are_admitted_call_by_call(grpc_daemon: GrpcDaemon) -> None:
    key, secret = (part.encode() for part in SHM_KEY)
    method = "SystemSharedMemoryStatus"
    with_key = request_block(method, [(key, secret)])
    without = request_block(method)
    with RawH2(grpc_daemon.tcp) as client:
        client.start()
        answers = [_status(client, stream, with_key if stream % 4 == 1 else without) for stream in range(1, 17, 2)]
    assert answers == [OK, PERMISSION_DENIED] * 4


def _infer(client: RawH2, stream: int, model: str, values: np.ndarray) -> tuple[bytes, pb.ModelInferResponse]:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="input", datatype="FP32", shape=values.shape)
    request.raw_input_contents.append(values.tobytes())
    client.send(frame(HEADERS, END_HEADERS, stream, request_block("ModelInfer")),
                frame(DATA, END_STREAM, stream, message(request.SerializeToString())))
    fields, body = client.response(stream)
    return fields[b"grpc-status"], pb.ModelInferResponse.FromString(body) if body else pb.ModelInferResponse()


def test_a_client_alternating_shapes_and_models_gets_each_calls_own_answer(grpc_daemon: GrpcDaemon) -> None:
    rng = np.random.default_rng(7)
    one, two = rng.random((1, 64), np.float32), rng.random((2, 64), np.float32)
    with RawH2(grpc_daemon.tcp) as client:
        client.start()
        _, alone = _infer(client, 1, "tiny_mlp", one)
        _, pair = _infer(client, 3, "tiny_mlp", two)
        stream = 5
        for _ in range(3):
            for values, expected in ((one, alone), (two, pair)):
                status, answer = _infer(client, stream, "tiny_mlp", values)
                assert status == OK and answer == expected
                stream += 2
            # the same tensor bytes and shape under a model that does not exist: refused, never tiny_mlp's answer
            status, _ = _infer(client, stream, "tiny_mlq", one)
            assert status == b"5"  # NOT_FOUND
            stream += 2
    assert list(alone.outputs[0].shape) == [1, 10] and list(pair.outputs[0].shape) == [2, 10]


_HEADERS = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
            (b"content-type", b"application/grpc"), (b"te", b"trailers"), (b"grpc-timeout", b"5S")]


def test_equal_header_lists_share_one_parsed_request_and_others_get_their_own() -> None:
    heads = RequestHeads()
    first = heads.parse(list(_HEADERS))
    assert heads.parse(list(_HEADERS)) is first and first.timeout_s == 5.0
    other = heads.parse([*_HEADERS[:-1], (b"grpc-timeout", b"6S")])
    assert other is not first and other.timeout_s == 6.0
    keyed = heads.parse([*_HEADERS, (b"edged-key", b"x")])
    assert keyed.metadata[b"edged-key"] == b"x" and b"edged-key" not in first.metadata


def test_a_refused_header_list_is_refused_every_time() -> None:
    heads = RequestHeads()
    bad = [*_HEADERS, (b"Upper", b"x")]
    for _ in range(2):
        with pytest.raises(ValueError, match="uppercase"):
            heads.parse(bad)


def test_the_parsed_headers_kept_stay_bounded() -> None:
    heads = RequestHeads()
    for n in range(3 * _HEADS):
        assert heads.parse([*_HEADERS, (b"x-n", str(n).encode())]).metadata[b"x-n"] == str(n).encode()
        assert len(heads._cache) <= _HEADS
    heads.parse([*_HEADERS, (b"x-big", b"v" * 4096)])  # past the size kept: parsed, not kept
    assert all(b"x-big" not in request.metadata for request in heads._cache.values())

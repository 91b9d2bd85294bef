"""Hostile and malformed ModelInfer requests, sent as raw protobuf messages (tritonclient would refuse some of
them before sending): each gets a gRPC status naming what was wrong, and the server keeps serving. A
hypothesis fuzz of shapes (zeros, overflows) and datatypes must always end in a status, never a hang."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from grpcapi_daemon import MAX_MESSAGE_MB, GrpcDaemon
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edged.grpcapi.proto import grpc_service_pb2 as pb

INFER = "/inference.GRPCInferenceService/ModelInfer"
DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
             "FP64", "BYTES", "BF16", "", "fp32", "STRING"]


@pytest.fixture(scope="module")
def channel(grpc_daemon: GrpcDaemon) -> Iterator[grpc.Channel]:
    limit = 4 * MAX_MESSAGE_MB * 1024 * 1024  # the client may send more than the server accepts
    with grpc.insecure_channel(grpc_daemon.tcp, options=[("grpc.max_send_message_length", limit),
                                                         ("grpc.max_receive_message_length", limit)]) as opened:
        yield opened


def _infer(channel: grpc.Channel, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
    call = channel.unary_unary(INFER, request_serializer=pb.ModelInferRequest.SerializeToString,
                               response_deserializer=pb.ModelInferResponse.FromString)
    response: pb.ModelInferResponse = call(request, timeout=30)
    return response


def _request(shape: list[int], datatype: str = "FP32", raw: bytes | None = None,
             model: str = "tiny_mlp") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="input", datatype=datatype, shape=shape)
    if raw is not None:
        request.raw_input_contents.append(raw)
    return request


def _status(channel: grpc.Channel, request: pb.ModelInferRequest) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as failed:
        _infer(channel, request)
    error = failed.value
    return error.code(), error.details()


def test_typed_contents_are_accepted_like_raw_contents(channel: grpc.Channel) -> None:
    values = np.linspace(-1, 1, 64, dtype=np.float32)
    typed = _request([1, 64])
    typed.inputs[0].contents.fp32_contents.extend(values.tolist())
    raw = _infer(channel, _request([1, 64], raw=values.tobytes()))
    answer = _infer(channel, typed)
    assert answer.raw_output_contents[0] == raw.raw_output_contents[0]
    assert list(answer.outputs[0].shape) == [1, 10]


@pytest.mark.parametrize(("request_", "code", "words"), [
    (_request([1, 63], raw=bytes(63 * 4)), grpc.StatusCode.INVALID_ARGUMENT, "input"),
    (_request([1, 64], "FP64", raw=bytes(64 * 8)), grpc.StatusCode.INVALID_ARGUMENT, "input"),
    (_request([1, 64], raw=bytes(64 * 4 - 1)), grpc.StatusCode.INVALID_ARGUMENT, "expected 256"),
    (_request([1, 64], "NOPE", raw=bytes(256)), grpc.StatusCode.INVALID_ARGUMENT, "unknown or unsupported datatype"),
    (_request([1, -64], raw=bytes(256)), grpc.StatusCode.INVALID_ARGUMENT, "negative dimension"),
    (_request([1 << 40, 1 << 40], raw=b""), grpc.StatusCode.INVALID_ARGUMENT, "more than the limit"),
    (_request([0, 19, 1 << 58], "BOOL", raw=b""), grpc.StatusCode.INVALID_ARGUMENT, "more than the limit"),
    (_request([1] * 65, raw=bytes(4)), grpc.StatusCode.INVALID_ARGUMENT, "65 dimensions, more than the limit of 32"),
    (_request([1, 64], raw=bytes(256), model="no_such_model"), grpc.StatusCode.NOT_FOUND, "no_such_model"),
    (_request([1, 64], raw=bytes(256), model=""), grpc.StatusCode.INVALID_ARGUMENT, "model_name is empty"),
], ids=["wrong-shape", "wrong-datatype", "raw-length", "unknown-datatype", "negative-dim", "overflow", "empty-overflow",
        "too-many-dims", "unknown-model", "no-model"])
def test_bad_requests_get_a_status_naming_the_problem(channel: grpc.Channel, request_: pb.ModelInferRequest,
                                                      code: grpc.StatusCode, words: str) -> None:
    got, details = _status(channel, request_)
    assert got == code and words in details, details


def test_typed_contents_of_the_wrong_count_or_range_are_refused(channel: grpc.Channel) -> None:
    short = _request([1, 64])
    short.inputs[0].contents.fp32_contents.extend([1.0] * 63)
    assert _status(channel, short) == (grpc.StatusCode.INVALID_ARGUMENT,
                                       "input 'input': 63 values in contents.fp32_contents, expected 64 for shape "
                                       "[1, 64]")
    out_of_range = _request([1, 2], "UINT8")
    out_of_range.inputs[0].contents.uint_contents.extend([1, 300])
    code, details = _status(channel, out_of_range)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "does not fit in UINT8" in details
    both = _request([1, 64], raw=bytes(256))
    both.inputs[0].contents.fp32_contents.extend([1.0] * 64)
    assert _status(channel, both)[0] == grpc.StatusCode.INVALID_ARGUMENT
    extra = _request([1, 64], raw=bytes(256))
    extra.raw_input_contents.append(b"x")
    assert "expected 1 raw_input_contents" in _status(channel, extra)[1]


def test_a_message_past_the_limit_is_resource_exhausted_and_the_server_keeps_serving(channel: grpc.Channel) -> None:
    huge = _request([1, 64], raw=bytes(MAX_MESSAGE_MB * 1024 * 1024 + 1))
    assert _status(channel, huge)[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert list(_infer(channel, _request([1, 64], raw=bytes(256))).outputs[0].shape) == [1, 10]


def test_a_camera_frame_fits_the_default_sized_limit(channel: grpc.Channel) -> None:
    frame = np.zeros((1, 1080, 1920, 3), np.uint8)  # 6.2 MB: above grpcio's own 4 MB default
    request = pb.ModelInferRequest(model_name="camera_frame")
    request.inputs.add(name="frame", datatype="UINT8", shape=frame.shape)
    request.raw_input_contents.append(frame.tobytes())
    answer = _infer(channel, request)
    assert answer.model_name == "camera_frame" and answer.raw_output_contents


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.one_of(st.integers(0, 70), st.integers(-3, 1 << 62)), max_size=4),
       datatype=st.sampled_from(DATATYPES), raw_length=st.integers(0, 600), typed=st.booleans())
def test_fuzzed_infer_requests_always_get_a_status(channel: grpc.Channel, shape: list[int], datatype: str,
                                                   raw_length: int, typed: bool) -> None:
    request = _request(shape, datatype, None if typed else bytes(raw_length))
    if typed:
        request.inputs[0].contents.int64_contents.extend(range(raw_length % 70))
    try:
        _infer(channel, request)
    except grpc.RpcError as e:
        assert e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), e.details()
    ready = channel.unary_unary("/inference.GRPCInferenceService/ServerLive",
                                request_serializer=pb.ServerLiveRequest.SerializeToString,
                                response_deserializer=pb.ServerLiveResponse.FromString)
    assert ready(pb.ServerLiveRequest(), timeout=10).live

"""The work one unary ModelInfer costs the event loop, counted (not timed) over a real Unix socket, as
tests/serving/test_serving_hot_path.py counts it for HTTP: the request is parsed from its frames on the loop,
the fast model runs inline, and the answer leaves in one write from the engine's callback: no task, no future,
no thread hop (grpcio's server handed each call through four completions and its poller thread)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import uvloop
from h2_raw import DATA, END_HEADERS, END_STREAM, HEADERS, RawH2, frame, message, request_block
from loop_calls import LoopCalls

from edged.config import ModelsConfig, ServerConfig
from edged.engine import InferenceService
from edged.grpcapi import GrpcServer
from edged.grpcapi.proto import grpc_service_pb2 as pb
from edged.shm import SharedMemoryRegistry

MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, LoopCalls]]:
    tmp = tmp_path_factory.mktemp("hot")
    (tmp / "repo").mkdir()
    (tmp / "repo" / "tiny_mlp").symlink_to(MODELS / "tiny_mlp")
    service = InferenceService(tmp / "repo", ModelsConfig(control_mode="explicit", startup_models=("*",)))
    service.start()
    calls = LoopCalls()
    loop = uvloop.new_event_loop()
    threading.setprofile(calls)  # reaches the loop thread, started now
    try:
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
    calls.loop_thread = thread.ident
    path = tmp / "grpc.sock"
    server = GrpcServer(service, ServerConfig(grpc_socket=str(path)), SharedMemoryRegistry())
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    yield path, calls
    asyncio.run_coroutine_threadsafe(server.stop(1), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    service.close(2.0)


def _infer_frames(stream: int, values: np.ndarray) -> bytes:
    request = pb.ModelInferRequest(model_name="tiny_mlp")
    request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.append(values.tobytes())
    return (frame(HEADERS, END_HEADERS, stream, request_block("ModelInfer"))
            + frame(DATA, END_STREAM, stream, message(request.SerializeToString())))


def test_a_unary_model_infer_costs_the_loop_only_the_short_path(served: tuple[Path, LoopCalls]) -> None:
    path, calls = served
    rng = np.random.default_rng(0)
    with RawH2.unix(path) as client:
        client.start()
        client.send(_infer_frames(1, rng.random(64, np.float32)))
        first = client.response(1)
        calls.recording = True
        client.send(_infer_frames(3, rng.random(64, np.float32)))
        fields, body = client.response(3)
        calls.recording = False
    assert first[0][b"grpc-status"] == fields[b"grpc-status"] == b"0"
    assert list(pb.ModelInferResponse.FromString(body).outputs[0].shape) == [1, 10]
    python = calls.python
    assert python["onnxruntime.py:run"] == 1, "the model did not run on the loop thread: a thread hop"
    assert python["_h2_connection.py:respond_message"] == 1, "the answer did not leave in one piece"
    assert calls.builtin["create_task"] == 0 and calls.builtin["create_future"] == 0, "a task or future per call"
    assert python["_h2_connection.py:data_received"] == 1 and python["_hpack.py:decode"] == 1
    assert python["_tensors.py:decode_infer"] == 0, "a repeated request layout went through protobuf's parser"
    assert python["_tensors.py:encode_infer"] == 0, "a repeated response layout was built as a message"
    assert calls.builtin["ModelInferRequest.FromString"] == calls.builtin["ModelInferResponse.SerializeToString"] == 0
    assert python["_grpc_stream.py:__init__"] == 1, "headers seen before were parsed again (only the call is new)"
    # InferenceService.submit takes the default version's cached choice itself (no Registry.resolve call)
    assert python["registry.py:resolve"] == 0, "the model version was looked up through Registry.resolve"
    # All of it (engine and codec included), as a ceiling with a little room: 12f6c68 made 93 Python calls here,
    # this 42 (over the Unix socket, peer credentials judged per call; TCP one less).
    assert sum(python.values()) <= 43, "\n".join(f"{k} {v}" for k, v in sorted(python.items()))


def _stream_message(values: np.ndarray, request_id: str = "", version: str = "") -> bytes:
    request = pb.ModelInferRequest(model_name="tiny_mlp", id=request_id, model_version=version)
    request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.append(values.tobytes())
    return frame(DATA, 0, 1, message(request.SerializeToString()))


def _stream_answer(client: RawH2) -> pb.ModelStreamInferResponse:
    """The next answer of stream 1 (its DATA frame; the first one follows the response headers)."""
    while (got := client.read()) is not None:
        if got.stream == 1 and got.kind == DATA:
            return pb.ModelStreamInferResponse.FromString(got.payload[5:])
    raise AssertionError("the connection closed before the stream's answer")


def _record(calls: LoopCalls, client: RawH2, data: bytes) -> pb.ModelStreamInferResponse:
    """Send ``data`` on the open stream and count what the loop spends until its answer is read."""
    calls.python.clear()
    calls.builtin.clear()
    calls.recording = True
    client.send(data)
    answer = _stream_answer(client)
    calls.recording = False
    return answer


def _end_stream(client: RawH2) -> dict[bytes, bytes]:
    client.send(frame(DATA, END_STREAM, 1))
    return client.response(1)[0]


def test_a_streamed_model_infer_costs_the_loop_only_the_short_path(served: tuple[Path, LoopCalls]) -> None:
    path, calls = served
    rng = np.random.default_rng(1)
    # The test before this one sent on another connection: within 2 ms of that, the server would gather the two
    # senders' requests for the next 50 ms (edged.grpcapi._infer, _OVERLAP_S / _HOLD_S), a path of its own (flush,
    # intake) that one CI run in four measured here. Past both windows only this stream's path is counted.
    time.sleep(0.1)
    with RawH2.unix(path) as client:
        client.start()
        client.send(frame(HEADERS, END_HEADERS, 1, request_block("ModelStreamInfer")),
                    _stream_message(rng.random(64, np.float32)))
        first = _stream_answer(client)
        answer = _record(calls, client, _stream_message(rng.random(64, np.float32)))
        assert _end_stream(client)[b"grpc-status"] == b"0"
    python, builtin = dict(calls.python), dict(calls.builtin)
    calls.python.clear()
    calls.builtin.clear()
    assert first.error_message == answer.error_message == ""
    assert list(answer.infer_response.outputs[0].shape) == [1, 10]
    assert python.get("onnxruntime.py:run") == 1, "the model did not run on the loop thread: a thread hop"
    assert python.get("_h2_connection.py:respond") == 1, "the answer did not leave in one piece"
    # uvloop's create_task is not seen by the profile hook; what a task or future is then used for is
    tasks = sorted(name for name in builtin if name.startswith(("Task.", "Future.", "create_task", "create_future")))
    assert tasks == [], f"a task or future per request: {tasks}"
    assert python.get("_tensors.py:decode_infer", 0) == 0, "a repeated request layout went through protobuf's parser"
    assert python.get("_tensors.py:encode_infer", 0) == 0, "a repeated response layout was built as a message"
    assert builtin.get("ModelInferRequest.FromString", 0) == 0
    assert builtin.get("ModelStreamInferResponse.SerializeToString", 0) == 0, "the wrapper was built by protobuf"
    # InferenceService.submit takes the default version's cached choice itself (no Registry.resolve call)
    assert python.get("registry.py:resolve", 0) == 0, "the model version was looked up through Registry.resolve"
    # All of it (engine and codec included), as a ceiling with a little room: 45584a1 made 95 Python calls
    # here (a task per request, protobuf's parser); this makes 35.
    assert sum(python.values()) <= 36, "\n".join(f"{k} {v}" for k, v in sorted(python.items()))


def test_a_streamed_repeated_layout_is_reused_and_a_differing_one_is_not(served: tuple[Path, LoopCalls]) -> None:
    """perf_analyzer --streaming numbers its requests: a layout differing only in the id is still the same."""
    path, calls = served
    values = np.arange(64, dtype=np.float32)
    with RawH2.unix(path) as client:
        client.start()
        client.send(frame(HEADERS, END_HEADERS, 1, request_block("ModelStreamInfer")),
                    _stream_message(values, "1"))
        first = _stream_answer(client)
        repeated = _record(calls, client, _stream_message(values, "2"))
        reused = calls.python.get("_tensors.py:decode_infer", 0), calls.python.get("_tensors.py:encode_infer", 0)
        differing = _record(calls, client, _stream_message(values, "3", version="1"))
        parsed = calls.python.get("_tensors.py:decode_infer", 0)
        assert _end_stream(client)[b"grpc-status"] == b"0"
    calls.python.clear()
    calls.builtin.clear()
    assert reused == (0, 0), "a repeated layout on a stream (another id) went through protobuf"
    assert parsed == 1, "a request whose bytes before its tensors differ was served from another's layout"
    assert (first.infer_response.id, repeated.infer_response.id, differing.infer_response.id) == ("1", "2", "3")
    assert differing.infer_response.model_version == "1"
    assert repeated.infer_response.raw_output_contents == first.infer_response.raw_output_contents
    assert differing.infer_response.raw_output_contents == first.infer_response.raw_output_contents

"""Answers a gRPC client does not read, as raw frames to a spawned daemon with a small ``grpc_max_unsent_mb``:
a client that closes its flow-control windows holds at most the bound (plus one answer) however many calls
it makes, the calls past it get RESOURCE_EXHAUSTED naming the key, what was kept still arrives once the
client reads, and a connection whose answers stay unread for ``request_timeout_s`` gets GOAWAY."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from h2_raw import (
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    HEADERS,
    WINDOW_UPDATE,
    RawH2,
    data_frames,
    frame,
    message,
    request_block,
)
from integration.edged_daemon import DaemonProcess, config_with_fakes, start_daemon

from edged.grpcapi.proto import grpc_service_pb2 as pb

ELEMENTS = 64 << 10  # FP32: each answer is 256 KiB, so four fill the 1 MiB bound
ANSWER = ELEMENTS * 4
RESOURCE_EXHAUSTED = b"8"
INITIAL_WINDOW_0 = struct.pack(">HI", 4, 0)  # SETTINGS_INITIAL_WINDOW_SIZE = 0: no answer DATA can leave


def _model(repo: Path, name: str, batching: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model").write_bytes(b"test backend model\n")
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "doubling"\nmax_batch_size: 8\n'
        f'input [ {{ name: "input", data_type: TYPE_FP32, dims: [ {ELEMENTS} ] }} ]\n'
        f'output [ {{ name: "output", data_type: TYPE_FP32, dims: [ {ELEMENTS} ] }} ]\n{batching}\n')


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, str]]:
    workdir = tmp_path_factory.mktemp("grpc-unread")
    repo = workdir / "models"
    _model(repo, "wide", "")
    # a second's batching delay: every request of one write is taken before the first answer exists
    _model(repo, "wide_batched", "dynamic_batching { max_queue_delay_microseconds: 1000000 }")
    config = config_with_fakes(f'repository = "{repo}"\nwarmup = false\n\n[server]\ngrpc_port = 0\n'
                               'grpc_max_message_mb = 4\ngrpc_max_unsent_mb = 1\nrequest_timeout_s = 2\n'
                               'idle_timeout_s = 600\n')
    process = start_daemon(workdir / "run", config=config)
    try:
        yield process, process.client().status()["grpc_listeners"][0]
    finally:
        process.stop()


def _request(model: str) -> bytes:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="input", datatype="FP32", shape=[1, ELEMENTS])
    request.raw_input_contents.append(np.ones(ELEMENTS, np.float32).tobytes())
    return message(request.SerializeToString())


def _window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", increment))


def test_unary_answers_past_the_bound_are_refused_and_those_kept_arrive_once_read(
        daemon: tuple[DaemonProcess, str]) -> None:
    _, address = daemon
    streams = list(range(1, 32, 2))  # 16 calls: 4 MiB of answers unbounded, against a 1 MiB bound
    with RawH2(address) as client:
        client.start(INITIAL_WINDOW_0)
        body = _request("wide")
        for stream in streams:
            client.send(frame(HEADERS, END_HEADERS, stream, request_block("ModelInfer")), *data_frames(stream, body))
        kept: set[int] = set()
        refused: dict[int, dict[bytes, bytes]] = {}
        while len(kept) + len(refused) < len(streams):  # each call shows a response head or its trailers-only end
            got = client.read()
            assert got is not None, "the connection closed"
            if got.kind == HEADERS:
                fields = dict(client.decoder.decode(got.payload))
                if got.flags & END_STREAM:
                    refused[got.stream] = fields
                else:
                    kept.add(got.stream)
        assert 1 <= len(kept) <= 5, f"{len(kept)} answers of {ANSWER} bytes kept against a 1 MiB bound"
        for fields in refused.values():
            assert fields[b"grpc-status"] == RESOURCE_EXHAUSTED
            assert b"grpc_max_unsent_mb" in fields[b"grpc-message"]
        # the client reads now: every answer kept arrives whole, with OK
        client.send(_window_update(0, len(kept) * (ANSWER + 64)),
                    *(_window_update(stream, ANSWER + 64) for stream in kept))
        for stream in sorted(kept):
            fields, answer = client.response(stream)
            assert fields[b"grpc-status"] == b"0"
            assert len(pb.ModelInferResponse.FromString(answer).raw_output_contents[0]) == ANSWER
        client.send(frame(HEADERS, END_HEADERS, 101, request_block("ServerLive")),
                    _window_update(101, 1 << 16), *data_frames(101, message(b"")))
        fields, _ = client.response(101)
        assert fields[b"grpc-status"] == b"0"  # nothing waits any more: calls are taken again


def test_stream_answers_past_the_bound_become_errors_in_the_stream(daemon: tuple[DaemonProcess, str]) -> None:
    _, address = daemon
    count = 8  # 2 MiB of answers taken before the first exists (the batching delay), against a 1 MiB bound
    with RawH2(address) as client:
        client.start(INITIAL_WINDOW_0)
        client.send(frame(HEADERS, END_HEADERS, 1, request_block("ModelStreamInfer")),
                    *data_frames(1, _request("wide_batched") * count))
        client.until(HEADERS, 1)  # the response head: answers exist and wait for the window
        client.send(_window_update(0, 16 << 20), _window_update(1, 16 << 20))
        data, answers = b"", []
        while len(answers) < count:
            got = client.read()
            assert got is not None, f"the connection closed after {len(answers)} answers"
            if got.kind == DATA and got.stream == 1:
                data += got.payload
                while len(data) >= 5 and len(data) >= 5 + (length := int.from_bytes(data[1:5], "big")):
                    answers.append(pb.ModelStreamInferResponse.FromString(data[5:5 + length]))
                    data = data[5 + length:]
    served = [answer for answer in answers if not answer.error_message]
    errors = [answer.error_message for answer in answers if answer.error_message]
    assert 1 <= len(served) <= 5, f"{len(served)} answers of {ANSWER} bytes kept against a 1 MiB bound"
    assert errors and all("grpc_max_unsent_mb" in error for error in errors)


def test_a_connection_whose_answers_stay_unread_gets_goaway(daemon: tuple[DaemonProcess, str]) -> None:
    process, address = daemon
    with RawH2(address) as client:
        client.start(INITIAL_WINDOW_0)
        client.send(frame(HEADERS, END_HEADERS, 1, request_block("ModelInfer")), *data_frames(1, _request("wide")))
        # nothing is read: past request_timeout_s (2 s; idle_timeout_s is 600 s) the daemon gives up on it
        assert client.goaway().code == ENHANCE_YOUR_CALM
    log = process.output()
    assert "answers waited unread" in log and "the TCP client 127.0.0.1:" in log

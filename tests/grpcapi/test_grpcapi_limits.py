"""gRPC under the HTTP API's limits, as raw frames to a spawned daemon with small limits: request messages
being received share the in-flight body budget, a message that stops arriving meets ``request_timeout_s``,
and a connection with nothing open meets ``idle_timeout_s``."""

from __future__ import annotations

import queue
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from h2_raw import (
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    RawH2,
    data_frames,
    frame,
    message,
    request_block,
)
from integration.edged_daemon import DaemonProcess, config_with_fakes, start_daemon

from edged.grpcapi._h2_inflow import CONNECTION_WINDOW, STREAM_WINDOW
from edged.grpcapi._stream_infer import STREAM_IN_FLIGHT
from edged.grpcapi.proto import grpc_service_pb2 as pb

BUDGET = 4 << 20  # [server] max_inflight_body_bytes
DECLARED = 1536 << 10  # each attacking stream's message: two fit in the budget, a third does not
SENT = 1200 << 10  # what arrives of a partial one: three fit, a fourth does not
RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED = b"8", b"4"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, str]]:
    workdir = tmp_path_factory.mktemp("grpc-limits")
    config = config_with_fakes(
        '[server]\ngrpc_port = 0\ngrpc_max_message_mb = 2\nmax_body_bytes = 1048576\n'
        f'max_inflight_body_bytes = {BUDGET}\nrequest_timeout_s = 2\nidle_timeout_s = 2\n')
    process = start_daemon(workdir, config=config)
    try:
        listeners = process.client().status()["grpc_listeners"]
        yield process, listeners[0]
    finally:
        process.stop()


def _status(process: DaemonProcess, section: str = "limits") -> dict[str, Any]:
    client = process.client()  # a fresh connection: the 2 s idle timeout closes kept ones
    try:
        doc: dict[str, Any] = client.status()[section]
        return doc
    finally:
        client.close()


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within 30 s: {what}")
        time.sleep(0.05)


def _partial(stream: int, declared: int, sent: int) -> list[bytes]:
    """A ModelInfer whose message declares ``declared`` bytes and sends ``sent`` of them, the stream left open."""
    body = b"\x00" + declared.to_bytes(4, "big") + bytes(sent)
    return [frame(HEADERS, END_HEADERS, stream, request_block("ModelInfer")), *data_frames(stream, body, False)]


def _trailers(client: RawH2, streams: set[int]) -> dict[int, dict[bytes, bytes]]:
    """Read until each of ``streams`` has ended with trailers; their fields."""
    ended: dict[int, dict[bytes, bytes]] = {}
    while not streams <= ended.keys():
        got = client.read()
        if got is None:
            raise AssertionError(f"the connection closed; streams ended: {sorted(ended)}")
        if got.kind == HEADERS:
            fields = client.decoder.decode(got.payload)
            if got.flags & END_STREAM:
                ended[got.stream] = dict(fields)
    return ended


def _served(address: str) -> None:
    with RawH2(address) as other:
        other.start()
        fields, body = other.call(1, "ServerLive", pb.ServerLiveRequest().SerializeToString())
        assert fields[b"grpc-status"] == b"0" and pb.ServerLiveResponse.FromString(body).live


def test_partial_messages_share_the_in_flight_budget_and_release_it_on_reset(daemon: tuple[DaemonProcess, str],
                                                                             ) -> None:
    process, address = daemon
    rss_before = process.rss_kib()
    streams = list(range(1, 80, 2))  # 40 streams, each sending 1.2 MB of a 1.5 MB message: 48 MB unbounded
    with RawH2(address) as client:
        client.start()
        for stream in streams:
            client.send(*_partial(stream, DECLARED, SENT))
        refused = _trailers(client, set(streams[3:]))  # the bytes arrived are charged: three fit the budget
        for fields in refused.values():
            assert fields[b"grpc-status"] == RESOURCE_EXHAUSTED
            assert b"max_inflight_body_bytes" in fields[b"grpc-message"]
        _wait(lambda: _status(process)["inflight_body_bytes"] == 3 * SENT, "the three first messages charged")
        assert _status(process)["inflight_body_limit_bytes"] == BUDGET
        assert process.rss_kib() - rss_before < 24 << 10, "the refused streams' bytes were kept"
        _served(address)
        client.send(*(frame(RST_STREAM, 0, stream, bytes(4)) for stream in streams[:3]))
        _wait(lambda: _status(process)["inflight_body_bytes"] == 0, "the budget released after the resets")


def test_length_prefixes_of_messages_that_never_come_hold_none_of_the_budget(
        daemon: tuple[DaemonProcess, str]) -> None:
    process, address = daemon
    streams = list(range(1, 80, 2))  # 40 prefixes claiming 1.5 MB each (60 MB), and no byte of the messages
    with RawH2(address) as client:
        client.start()
        for stream in streams:
            client.send(*_partial(stream, DECLARED, 0))
        fields, _ = client.call(101, "ServerLive", pb.ServerLiveRequest().SerializeToString())
        assert fields[b"grpc-status"] == b"0"  # read after the prefixes: they have all been seen
        assert _status(process)["inflight_body_bytes"] == 0, "claimed message lengths were reserved"
        with RawH2(address) as other:  # another client's two whole messages of that size fit meanwhile
            other.start()
            other.send(*_parked(1, message(bytes(DECLARED))), *_parked(3, message(bytes(DECLARED))))
            _wait(lambda: _status(process)["inflight_body_bytes"] == 2 * DECLARED, "the other client's messages kept")
            other.send(*(frame(RST_STREAM, 0, stream, bytes(4)) for stream in (1, 3)))
            _wait(lambda: _status(process)["inflight_body_bytes"] == 0, "the budget released after the resets")


def _parked(stream: int, body: bytes) -> list[bytes]:
    """A ModelInfer whose message ``body`` arrives whole and the stream is left open (no half-close)."""
    return [frame(HEADERS, END_HEADERS, stream, request_block("ModelInfer")), *data_frames(stream, body, False)]


def test_whole_unary_messages_waiting_for_the_half_close_stay_in_the_budget_until_reset(
        daemon: tuple[DaemonProcess, str]) -> None:
    process, address = daemon
    rss_before = process.rss_kib()
    streams = list(range(1, 80, 2))  # 40 streams, each a whole 1.5 MB message never half-closed: 60 MB unbounded
    with RawH2(address) as client:
        client.start()
        for stream in streams:
            client.send(*_parked(stream, message(bytes(DECLARED))))
        refused = _trailers(client, set(streams[2:]))
        for fields in refused.values():
            assert fields[b"grpc-status"] == RESOURCE_EXHAUSTED
            assert b"max_inflight_body_bytes" in fields[b"grpc-message"]
        _wait(lambda: _status(process)["inflight_body_bytes"] == 2 * DECLARED, "the two first messages kept")
        assert process.rss_kib() - rss_before < 24 << 10, "the refused streams' messages were kept"
        client.send(*(frame(RST_STREAM, 0, stream, bytes(4)) for stream in streams[:2]))
        _wait(lambda: _status(process)["inflight_body_bytes"] == 0, "the budget released after the resets")
    _served(address)


def test_a_one_frame_unary_message_is_charged_until_the_half_close_hands_it_to_the_engine(
        daemon: tuple[DaemonProcess, str]) -> None:
    process, address = daemon
    request = _stream_requests(1)  # one tiny_mlp request, framed: it fits one DATA frame
    with RawH2(address) as client:
        client.start()
        client.send(*_parked(1, request), *_parked(3, request))
        _wait(lambda: _status(process)["inflight_body_bytes"] == 2 * (len(request) - 5), "both messages charged")
        client.send(frame(DATA, END_STREAM, 1))
        fields, body = client.response(1)
        assert fields[b"grpc-status"] == b"0" and list(pb.ModelInferResponse.FromString(body).outputs[0].shape)
        _wait(lambda: _status(process)["inflight_body_bytes"] == len(request) - 5, "the answered one released")
    # the connection went with stream 3 still waiting: its message is released with it
    _wait(lambda: _status(process)["inflight_body_bytes"] == 0, "the budget released with the connection")


def test_a_message_that_stops_arriving_meets_the_request_timeout(daemon: tuple[DaemonProcess, str]) -> None:
    process, address = daemon
    with RawH2(address) as client:
        client.start()
        client.send(*_partial(1, 1000, 10))
        fields = _trailers(client, {1})[1]
        assert fields[b"grpc-status"] == DEADLINE_EXCEEDED and b"request_timeout_s" in fields[b"grpc-message"]
        _wait(lambda: _status(process)["inflight_body_bytes"] == 0, "the stalled message's budget released")


def test_a_unary_call_left_open_meets_the_request_timeout(daemon: tuple[DaemonProcess, str]) -> None:
    _, address = daemon
    with RawH2(address) as client:
        client.start()
        client.send(frame(HEADERS, END_HEADERS, 1, request_block("ModelInfer")))  # and never a message
        request = message(pb.ServerLiveRequest().SerializeToString())
        client.send(frame(HEADERS, END_HEADERS, 3, request_block("ServerLive")), *data_frames(3, request, False))
        ended = _trailers(client, {1, 3})  # the second: its message whole, never half-closed
        for fields in ended.values():
            assert fields[b"grpc-status"] == DEADLINE_EXCEEDED and b"request_timeout_s" in fields[b"grpc-message"]


def test_an_idle_connection_is_sent_goaway_and_closed(daemon: tuple[DaemonProcess, str]) -> None:
    _, address = daemon
    with RawH2(address) as client:
        client.start()
        fields, _ = client.call(1, "ServerLive", pb.ServerLiveRequest().SerializeToString())
        assert fields[b"grpc-status"] == b"0"
        goaway = client.goaway()  # waits: nothing is sent, so only the idle timeout can end it
        assert goaway.kind == GOAWAY and goaway.code == 0


def test_a_connection_with_a_call_in_progress_is_not_idle(daemon: tuple[DaemonProcess, str]) -> None:
    _, address = daemon
    with RawH2(address) as client:
        client.start()
        client.send(frame(HEADERS, END_HEADERS, 1, request_block("ModelStreamInfer")))
        time.sleep(3)  # past idle_timeout_s: a waiting stream keeps its connection (no timing is asserted)
        fields, _ = client.call(3, "ServerLive", pb.ServerLiveRequest().SerializeToString())
        assert fields[b"grpc-status"] == b"0"


def _stream_requests(count: int) -> bytes:
    request = pb.ModelInferRequest(model_name="tiny_mlp")
    request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.append(np.ones(64, np.float32).tobytes())
    return message(request.SerializeToString()) * count


def _read_answers(client: RawH2, stream: int) -> tuple[list[pb.ModelStreamInferResponse], dict[bytes, bytes]]:
    """Read the stream to its end, granting the server window for what is read; its answers and trailers."""
    data, answers, fields, unacked = b"", [], {}, 0
    while True:
        got = client.read()
        if got is None:
            raise AssertionError(f"the connection closed after {len(answers)} answers")
        if got.kind == DATA and got.stream == stream:
            data += got.payload
            unacked += len(got.payload)
            if unacked >= 1 << 15:
                client.send(*(frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", unacked)) for sid in (0, stream)))
                unacked = 0
            while len(data) >= 5 and len(data) >= 5 + (length := int.from_bytes(data[1:5], "big")):
                answers.append(pb.ModelStreamInferResponse.FromString(data[5:5 + length]))
                data = data[5 + length:]
        elif got.kind == HEADERS and got.stream == stream:
            fields.update(client.decoder.decode(got.payload))
            if got.flags & END_STREAM:
                return answers, fields


def test_a_stream_client_that_does_not_read_is_held_at_the_bound_and_then_gets_every_answer(
        daemon: tuple[DaemonProcess, str]) -> None:
    process, address = daemon
    count = 10_000
    body = _stream_requests(count)
    assert len(body) <= min(STREAM_WINDOW, CONNECTION_WINDOW)  # all of it within the windows granted at once
    holds = _status(process, "grpc")["stream_holds"]
    with RawH2(address) as client:
        client.start()
        client.send(frame(HEADERS, END_HEADERS, 1, request_block("ModelStreamInfer")), *data_frames(1, body))
        # nothing is read yet: the answers fill the client's 64 KB window and the daemon stops taking requests
        # (tiny_mlp runs inline, each answered as it is taken: the answers waiting hold the stream, not the bound)
        _wait(lambda: _status(process, "grpc")["stream_holds"] > holds, "the stream held")
        answers, fields = _read_answers(client, 1)
    assert fields[b"grpc-status"] == b"0"
    assert len(answers) == count and not any(answer.error_message for answer in answers)
    grpc = _status(process, "grpc")
    assert 1 <= grpc["stream_in_flight_peak"] <= grpc["stream_in_flight_limit"] == STREAM_IN_FLIGHT
    shown = subprocess.run([sys.executable, "-m", "edged", "status", "--socket", str(process.socket_path)],
                           capture_output=True, text=True, timeout=60, check=False)
    assert shown.returncode == 0, shown.stderr
    assert f"streams held {grpc['stream_holds']} times" in shown.stdout, shown.stdout  # what a technician sees


@pytest.fixture(scope="module")
def worker_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, str]]:
    """No model runs on the loop (``inline_execution_max_us = 0``): answers come back from worker threads, so
    requests of one stream pile up in flight and meet the bound."""
    # the body lands in config_with_fakes' [models] table before its own [server]
    config = config_with_fakes('inline_execution_max_us = 0\n[server]\ngrpc_port = 0\n')
    process = start_daemon(tmp_path_factory.mktemp("grpc-workers"), config=config)
    try:
        yield process, process.client().status()["grpc_listeners"][0]
    finally:
        process.stop()


def test_a_stream_whose_model_runs_on_workers_takes_at_most_the_bound_in_flight(
        worker_daemon: tuple[DaemonProcess, str]) -> None:
    process, address = worker_daemon
    count = 10_000
    with RawH2(address) as client:
        client.start()
        client.send(frame(HEADERS, END_HEADERS, 1, request_block("ModelStreamInfer")),
                    *data_frames(1, _stream_requests(count)))
        _wait(lambda: _status(process, "grpc")["stream_in_flight_peak"] >= STREAM_IN_FLIGHT,
              "the stream's requests in flight at the bound")
        answers, fields = _read_answers(client, 1)
    assert fields[b"grpc-status"] == b"0"
    assert len(answers) == count and not any(answer.error_message for answer in answers)
    grpc = _status(process, "grpc")
    assert grpc["stream_in_flight_peak"] == grpc["stream_in_flight_limit"] == STREAM_IN_FLIGHT


def test_tritonclient_writing_a_stream_as_fast_as_it_can_gets_every_answer_within_the_bound(
        daemon: tuple[DaemonProcess, str]) -> None:
    """grpcio's own flow control meets the held windows: the client waits and nothing is refused or lost."""
    process, address = daemon
    count = 3000
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    tensor = triton_grpc.InferInput("input", [1, 64], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 64), np.float32))
    client = triton_grpc.InferenceServerClient(address)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for index in range(count):
            client.async_stream_infer("tiny_mlp", [tensor], request_id=str(index))
        got = [answers.get(timeout=60) for _ in range(count)]
    finally:
        client.stop_stream()
        client.close()
    assert [error for _, error in got if error is not None] == []
    assert sorted(int(result.get_response().id) for result, _ in got) == list(range(count))
    assert _status(process, "grpc")["stream_in_flight_peak"] <= STREAM_IN_FLIGHT


def test_bytes_a_held_stream_keeps_unread_are_charged_to_the_budget_and_released(
        daemon: tuple[DaemonProcess, str]) -> None:
    process, address = daemon
    body = _stream_requests(10_000)  # 2.9 MB: within the windows and the 4 MB budget
    with RawH2(address) as client:
        client.start()
        client.send(frame(HEADERS, END_HEADERS, 1, request_block("ModelStreamInfer")), *data_frames(1, body))
        # not reading: the stream is held at its bound with most of what it sent kept unparsed, in the budget
        _wait(lambda: _status(process)["inflight_body_bytes"] >= len(body) // 2, "the held bytes charged")
        answers, fields = _read_answers(client, 1)
    assert fields[b"grpc-status"] == b"0" and len(answers) == 10_000
    _wait(lambda: _status(process)["inflight_body_bytes"] == 0, "the budget released as the stream was taken")


def test_a_held_stream_past_the_budget_ends_resource_exhausted_and_gives_the_budget_back(
        daemon: tuple[DaemonProcess, str]) -> None:
    process, address = daemon
    body = _stream_requests(16_000)  # 4.7 MB: within the stream's window, past the 4 MB budget
    assert BUDGET < len(body) <= STREAM_WINDOW
    with RawH2(address) as client:
        client.start()
        client.send(frame(HEADERS, END_HEADERS, 1, request_block("ModelStreamInfer")), *data_frames(1, body))
        answers, fields = _read_answers(client, 1)
    assert fields[b"grpc-status"] == RESOURCE_EXHAUSTED, fields
    assert b"max_inflight_body_bytes" in fields[b"grpc-message"]
    assert len(answers) < 16_000
    _wait(lambda: _status(process)["inflight_body_bytes"] == 0, "the budget whole again after the stream ended")
    _served(address)


NOFILE = 400
FLOOD = 500


def _descriptors(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def test_a_grpc_connection_flood_leaves_the_descriptor_reserve_and_the_http_api_served() -> None:
    """Both front ends are in the descriptor budget: under a hard RLIMIT_NOFILE gRPC serves the clamped limit,
    refused connections linger at most one backlog, the Unix-socket HTTP API still answers, and the flood
    logs a line, not one per refusal."""
    workdir = Path(tempfile.mkdtemp(prefix="edged-grpc-fd-", dir="/tmp"))  # AF_UNIX paths: 107 bytes at most
    config = config_with_fakes('[server]\ngrpc_port = 0\nmax_connections = 5000\nfd_reserve = 64\n'
                               'listen_backlog = 32\n')
    process = start_daemon(workdir, config=config, args=["--model-control-mode", "explicit"],
                           argv_prefix=["prlimit", f"--nofile={NOFILE}:{NOFILE}", "--"])
    held: list[socket.socket] = []
    try:
        status = process.client().status()
        limit, grpc = status["limits"]["max_connections"], status["grpc"]
        host, port = status["grpc_listeners"][0].rsplit(":", 1)
        assert 0 < limit == grpc["max_connections"] < (NOFILE - 64) // 2, (limit, grpc)
        peak, opening = 0, PREFACE + frame(SETTINGS, 0, 0)
        for count in range(FLOOD):
            sock = socket.create_connection((host, int(port)), timeout=5)
            held.append(sock)
            sock.sendall(opening)
            if count % 50 == 0:
                peak = max(peak, _descriptors(process.pid))
        time.sleep(0.5)  # the last ones accepted
        peak = max(peak, _descriptors(process.pid))
        answered = process.client().status()["grpc"]  # the HTTP API over its Unix socket, during the flood
        assert peak <= NOFILE - 64, f"{peak} descriptors open, the limit leaves {NOFILE - 64}"
        assert answered["connections"] == limit and answered["connections_refused"] >= FLOOD - limit, answered
        for sock in held:
            sock.close()
        held = []
        _wait(lambda: process.client().status()["grpc"]["connections"] < limit, "the flood's connections closed")
        _served(f"{host}:{port}")
    finally:
        for sock in held:
            sock.close()
        process.stop()
        output = process.output()
        shutil.rmtree(workdir, ignore_errors=True)
    assert "Too many open files" not in output
    assert "too many gRPC connections" not in output, "a log line per refused connection"
    assert 1 <= output.count("gRPC connection limit reached") <= 2, output[-2000:]

"""The gRPC families of the daemon's ``/metrics``, read with Prometheus' own parser after real tritonclient.grpc
calls and raw-frame protocol errors against the spawned daemon: calls by RPC and status (an RPC edged does not
serve counts as method="unknown"), refused streams, and the HTTP/2 error codes edged sent. Counts are compared
as differences across the calls each test makes, so the tests do not depend on each other's order."""

from __future__ import annotations

import asyncio
import queue
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from grpcapi_daemon import GrpcDaemon
from h2_raw import (
    DATA,
    END_HEADERS,
    ENHANCE_YOUR_CALM,
    HEADERS,
    PREFACE,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    RawH2,
    frame,
    request_block,
)
from integration.edged_daemon import DaemonProcess, config_with_fakes, start_daemon
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from edged.config import ModelsConfig, ServerConfig
from edged.engine import InferenceService
from edged.grpcapi import GrpcServer
from edged.shm import SharedMemoryRegistry

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _samples(daemon: DaemonProcess) -> Samples:
    return _parsed(daemon.client().metrics())


def _parsed(text: str) -> Samples:
    """Every sample by name and labels; the parser raises on any line that is not exposition text."""
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def _get(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def _calls(samples: Samples, method: str, code: str) -> float:
    return _get(samples, "edged_grpc_calls_total", method=method, code=code)


def _errors(samples: Samples, error: str) -> float:
    return _get(samples, "edged_grpc_protocol_errors_total", error=error)


def _input(columns: int) -> triton_grpc.InferInput:
    tensor = triton_grpc.InferInput("input", [1, columns], "FP32")
    tensor.set_data_from_numpy(np.ones((1, columns), dtype=np.float32))
    return tensor


def test_tritonclient_calls_are_counted_by_rpc_and_status(grpc_daemon: GrpcDaemon) -> None:
    before = _samples(grpc_daemon.daemon)
    client = triton_grpc.InferenceServerClient(grpc_daemon.tcp)
    for _ in range(3):
        client.infer("tiny_mlp", [_input(64)])
    assert client.is_server_live()
    with pytest.raises(InferenceServerException) as invalid:
        client.infer("tiny_mlp", [_input(63)])  # the model takes 64 columns
    assert invalid.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException) as unimplemented:
        client.get_trace_settings()  # TraceSetting: an RPC of Triton's that edged does not serve
    assert unimplemented.value.status() == "StatusCode.UNIMPLEMENTED"
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for _ in range(2):
            client.async_stream_infer("tiny_mlp", [_input(64)])
        assert [answers.get(timeout=30)[1] for _ in range(2)] == [None, None]
    finally:
        client.stop_stream()  # returns once the stream has ended: its OK trailers have arrived
    after = _samples(grpc_daemon.daemon)
    assert _calls(after, "ModelInfer", "OK") - _calls(before, "ModelInfer", "OK") == 3
    assert _calls(after, "ServerLive", "OK") - _calls(before, "ServerLive", "OK") == 1
    assert _calls(after, "ModelInfer", "INVALID_ARGUMENT") - _calls(before, "ModelInfer", "INVALID_ARGUMENT") == 1
    assert _calls(after, "unknown", "UNIMPLEMENTED") - _calls(before, "unknown", "UNIMPLEMENTED") == 1
    # a stream is one call, however many requests it carried
    assert _calls(after, "ModelStreamInfer", "OK") - _calls(before, "ModelStreamInfer", "OK") == 1
    assert not any(name == "edged_grpc_calls_total" and dict(labels)["method"] in ("TraceSetting", "")
                   for name, labels in after), "a method served by no RPC got its own label"
    assert _get(after, "edged_grpc_connections") >= 1  # tritonclient's channel stays open
    assert _get(after, "edged_grpc_connections_refused_total") == 0
    assert ("edged_http_connections", frozenset()) in after  # beside the HTTP families, in one exposition


def test_protocol_errors_and_refused_streams_are_counted_by_the_code_sent(grpc_daemon: GrpcDaemon) -> None:
    before = _samples(grpc_daemon.daemon)
    with RawH2(grpc_daemon.tcp) as client:  # a connection error: GOAWAY PROTOCOL_ERROR
        client.send(PREFACE + frame(SETTINGS, 0, 0) + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0)))
        assert client.goaway().code == PROTOCOL_ERROR
    with RawH2(grpc_daemon.tcp) as client:  # a stream error: RST_STREAM STREAM_CLOSED, the connection goes on
        client.start()
        client.call(1, "ServerLive", b"")
        client.send(frame(DATA, 0, 1, b"late"))
        assert client.until(RST_STREAM, 1).code == STREAM_CLOSED
    with RawH2(grpc_daemon.tcp) as client:  # one stream past the advertised 128: RST_STREAM REFUSED_STREAM
        client.start()
        limit = dict(struct.iter_unpack(">HI", client.until(SETTINGS).payload))[3]
        client.send(b"".join(frame(HEADERS, END_HEADERS, 2 * index + 1, request_block("ModelInfer"))
                             for index in range(limit + 1)))
        assert client.until(RST_STREAM, 2 * limit + 1).code == REFUSED_STREAM
    after = _samples(grpc_daemon.daemon)
    assert _errors(after, "PROTOCOL_ERROR") - _errors(before, "PROTOCOL_ERROR") == 1
    assert _errors(after, "STREAM_CLOSED") - _errors(before, "STREAM_CLOSED") == 1
    assert _errors(after, "ENHANCE_YOUR_CALM") == _errors(before, "ENHANCE_YOUR_CALM") == 0  # listed at 0
    assert _get(after, "edged_grpc_streams_refused_total") - _get(before, "edged_grpc_streams_refused_total") == 1
    assert _errors(after, "REFUSED_STREAM") == 0 and _errors(after, "NO_ERROR") == 0  # not protocol errors


@pytest.fixture(scope="module")
def http_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    daemon = start_daemon(tmp_path_factory.mktemp("http-only"), config=config_with_fakes())
    try:
        yield daemon
    finally:
        daemon.stop()


def test_without_grpc_configured_metrics_has_no_grpc_family(http_only: DaemonProcess) -> None:
    names = {name for name, _ in _samples(http_only)}
    assert "edged_http_connections" in names
    assert not {name for name in names if name.startswith("edged_grpc_")}


def test_a_connection_past_max_connections_is_counted_refused_not_as_a_protocol_error(tmp_path: Path) -> None:
    path = tmp_path / "grpc.sock"

    async def run() -> tuple[Samples, Samples]:
        server = GrpcServer(InferenceService(tmp_path, ModelsConfig()),
                            ServerConfig(grpc_socket=str(path), max_connections=1), SharedMemoryRegistry())
        await server.start()
        loop = asyncio.get_running_loop()
        try:
            with RawH2.unix(path) as first:
                await loop.run_in_executor(None, _served, first)
                one = _parsed(server.prometheus_lines())  # on the loop, as the daemon renders it
                await loop.run_in_executor(None, _refused, path)
                return one, _parsed(server.prometheus_lines())
        finally:
            await server.stop(1)

    one, after = asyncio.run(run())
    assert _get(one, "edged_grpc_connections") == 1
    assert _get(one, "edged_grpc_connections_refused_total") == 0
    assert _get(after, "edged_grpc_connections_refused_total") == 1
    assert _errors(after, "ENHANCE_YOUR_CALM") == 0  # the refusal's GOAWAY is counted once, as a refusal
    assert _calls(after, "ServerLive", "OK") == 1


def _served(client: RawH2) -> None:
    client.start()
    assert client.call(1, "ServerLive", b"")[0][b"grpc-status"] == b"0"


def _refused(path: Path) -> None:
    with RawH2.unix(path) as second:
        second.start()
        assert second.goaway().code == ENHANCE_YOUR_CALM

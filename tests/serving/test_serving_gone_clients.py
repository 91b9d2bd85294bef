"""An infer request whose HTTP client is gone while it waits in the model's queue is not run: the connection's
one cancellation, shared by its requests, is set when the connection is lost or found gone after a half-close,
and the engine drops what is still queued (a failed request in the statistics), with one log line per
connection. A client that half-closes and still reads (``nc -N``) gets its answers. Real sockets, a real ONNX
model whose batching delay (60 s) holds requests in the queue until one more fills the batch."""

from __future__ import annotations

import logging
import shutil
import socket
import struct
import time
from collections.abc import Iterator

import orjson
import pytest
from conftest import MODELS, RunningServer

from edged.config import ModelsConfig, ServerConfig

CONFIG = """name: "held"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "input", data_type: TYPE_FP32, dims: [ 64 ] } ]
output [ { name: "output", data_type: TYPE_FP32, dims: [ 10 ] } ]
dynamic_batching { max_queue_delay_microseconds: 60000000 }
instance_group [ { count: 1, kind: KIND_CPU } ]
"""
MAX_BATCH = 4


def _body(rows: int) -> bytes:
    return orjson.dumps({"inputs": [{"name": "input", "shape": [rows, 64], "datatype": "FP32",
                                     "data": [0.5] * (64 * rows)}]})


BODY = _body(1)
REQUEST = (b"POST /v2/models/held/infer HTTP/1.1\r\nhost: edged\r\ncontent-type: application/json\r\n"
           b"content-length: %d\r\n\r\n%s" % (len(BODY), BODY))
GONE = "is gone ("


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("gone")
    folder = tmp / "repo" / "held"
    (folder / "1").mkdir(parents=True)
    shutil.copyfile(MODELS / "tiny_mlp" / "1" / "model.onnx", folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(CONFIG)
    models = ModelsConfig(control_mode="explicit", startup_models=("held",))
    running = RunningServer(tmp / "repo", ServerConfig(http_port=0), tmp / "edged.sock", models)
    yield running
    running.stop()


def _counts(served: RunningServer) -> tuple[int, int]:
    """(succeeded, failed) requests of model held."""
    status, _, body = served.request("GET", "/v2/models/held/stats")
    assert status == 200, body
    stats = orjson.loads(body)["model_stats"][0]["inference_stats"]
    return stats["success"]["count"], stats["fail"]["count"]


def _connect(served: RunningServer, kind: str) -> socket.socket:
    if kind == "uds":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(served.socket_path))
    else:
        sock = socket.create_connection(("127.0.0.1", served.tcp_port))
    sock.settimeout(30)
    return sock


def _wait_for_log(caplog: pytest.LogCaptureFixture, text: str, count: int) -> None:
    deadline = time.monotonic() + 20
    while sum(text in record.getMessage() for record in caplog.records) < count:
        assert time.monotonic() < deadline, [record.getMessage() for record in caplog.records]
        time.sleep(0.01)


def _fill_the_batch(served: RunningServer, queued_rows: int) -> None:
    """A request of the rows the queued ones leave to max_batch_size: a worker takes the queue now."""
    status, _, body = served.request("POST", "/v2/models/held/infer", _body(MAX_BATCH - queued_rows),
                                     {"content-type": "application/json"})
    assert status == 200, body


@pytest.mark.parametrize(("kind", "hang_up"), [("uds", "close"), ("tcp", "close"), ("tcp", "reset")])
def test_a_queued_request_of_a_client_that_is_gone_is_not_run(served: RunningServer, caplog: pytest.LogCaptureFixture,
                                                              kind: str, hang_up: str) -> None:
    caplog.set_level(logging.INFO, logger="edged.serving")
    succeeded, failed = _counts(served)
    gone = _connect(served, kind)
    gone.sendall(REQUEST * 2)  # two pipelined requests on one connection: one log line for both
    if hang_up == "reset":
        gone.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    gone.close()
    _wait_for_log(caplog, GONE, 1)
    _fill_the_batch(served, 2)
    # the one filling request ran; both of the gone client's were taken out unrun, as failed requests
    assert _counts(served) == (succeeded + 1, failed + 2)
    lines = [record.getMessage() for record in caplog.records if GONE in record.getMessage()]
    assert len(lines) == 1 and "2 answer(s) owed" in lines[0] and "dropped unrun" in lines[0], lines


def test_a_client_that_half_closes_and_still_reads_gets_its_answer(served: RunningServer,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="edged.serving")
    succeeded, failed = _counts(served)
    reader = _connect(served, "tcp")
    reader.sendall(REQUEST)
    reader.shutdown(socket.SHUT_WR)  # nc -N: the FIN after the request, the socket still open for reading
    received = b""
    while b"100 Continue\r\n\r\n" not in received:  # the server saw the FIN and looked at the socket
        chunk = reader.recv(65536)
        assert chunk, received
        received += chunk
    _fill_the_batch(served, 1)
    while chunk:
        chunk = reader.recv(65536)
        received += chunk
    reader.close()
    answer = received.split(b"100 Continue\r\n\r\n", 1)[1]
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), received
    assert len(orjson.loads(answer.split(b"\r\n\r\n", 1)[1])["outputs"][0]["data"]) == 10
    assert _counts(served) == (succeeded + 2, failed)
    assert not any(GONE in record.getMessage() for record in caplog.records)

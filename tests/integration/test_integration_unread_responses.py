"""A client that sends requests and never reads the answers: once its answers have waited unread (the write
paused) for request_timeout_s, the connection is closed and what was owed to it is dropped, as gRPC does; the
daemon does not hold MAX_PIPELINED large answers per such connection for good."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import orjson
from integration.edged_daemon import config_with_fakes, start_daemon
from modelgen import add_custom_model

ELEMENTS = 262_144  # 1 MiB of FP32 in, about 2 MiB of JSON out per answer


def test_a_connection_whose_answers_stay_unread_is_closed_after_request_timeout_s(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    folder = add_custom_model(repo, "wide", "doubling", max_batch=0)
    config_text = (folder / "config.pbtxt").read_text().replace("dims: [ 4 ]", f"dims: [ {ELEMENTS} ]")
    (folder / "config.pbtxt").write_text(config_text)
    config = config_with_fakes('\n[server]\nrequest_timeout_s = 1.0\n')
    daemon = start_daemon(tmp_path / "run", config=config, args=["--model-repository", str(repo)])
    try:
        header = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [ELEMENTS],
                                           "parameters": {"binary_data_size": ELEMENTS * 4}}]})
        body = header + bytes(ELEMENTS * 4)
        request = (b"POST /v2/models/wide/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/octet-stream\r\n"
                   b"inference-header-content-length: %d\r\ncontent-length: %d\r\n\r\n" % (len(header), len(body))
                   + body)
        greedy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        greedy.connect(str(daemon.socket_path))
        greedy.settimeout(0.5)
        sent = 0
        deadline = time.monotonic() + 60
        while sent < 8 and time.monotonic() < deadline:  # until the daemon stops reading (its writes paused)
            try:
                greedy.sendall(request)
                sent += 1
            except (TimeoutError, BrokenPipeError, ConnectionResetError):
                break
        closed = False
        while time.monotonic() < deadline and not closed:  # the answers are never read; only the close is looked for
            closed = "stay unread" in daemon.output()
            time.sleep(0.1)
        assert closed, f"the connection was never closed:\n{daemon.output()}"
        greedy.settimeout(10)
        try:  # what is read now ends: the daemon closed its end, with a reset or a FIN after part of the answers
            while greedy.recv(1 << 20):
                pass
        except ConnectionResetError:
            pass
        greedy.close()
        assert daemon.client().live()  # the daemon serves on
    finally:
        daemon.stop(10)

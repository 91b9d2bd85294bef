"""Batch formation over the socket API: 16 connections that send at once, to a model with a batching delay,
get one batch of 16 (the loop submits what it reads together, the scheduler waits out the delay), and the
service's intake (edged.engine.intake), open while the loop holds requests back, is closed once they are
submitted, so no later batch waits on it. A lone client's requests to a model with a short delay are waited out
and run on the event loop's thread once its traffic is solo: no worker is woken for them."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import numpy as np
from conftest import RunningServer
from modelgen import add_tiny_delay_model

from edged.config import ServerConfig
from edged.engine.worker_pool import SOLO_EVIDENCE
from edged.protocol import encode_request

CLIENTS = 16


def delay_model(tmp_path: Path, delay_us: int = 2_000_000) -> Path:
    # 2 s by default: the batch runs once it holds 16 rows, long before; only arrivals spread over 2 s split it
    return add_tiny_delay_model(tmp_path / "repo", "tiny_d", CLIENTS, delay_us)


def raw_request() -> bytes:
    body, header_length = encode_request({"input": np.ones((1, 64), np.float32)})
    head = (f"POST /v2/models/tiny_d/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
            f"Inference-Header-Content-Length: {header_length}\r\nContent-Type: application/octet-stream\r\n\r\n")
    return head.encode() + body


def read_status(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    return data.split(b"\r\n", 1)[0]


def test_sixteen_connections_sending_at_once_form_one_batch_and_leave_the_intake_closed(tmp_path: Path) -> None:
    running = RunningServer(delay_model(tmp_path), ServerConfig(), tmp_path / "edged.sock")
    sockets = []
    try:
        for _ in range(CLIENTS):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(30)
            sock.connect(str(tmp_path / "edged.sock"))
            sockets.append(sock)
        request = raw_request()
        for sock in sockets:
            sock.sendall(request)
        assert [read_status(sock) for sock in sockets] == [b"HTTP/1.1 200 OK"] * CLIENTS
        stats = running.service.statistics("tiny_d")["model_stats"][0]
        assert (stats["inference_count"], stats["execution_count"]) == (CLIENTS, 1)
        assert not running.service.intake.is_open
    finally:
        for sock in sockets:
            sock.close()
        running.stop()


def test_a_lone_clients_requests_with_a_short_delay_wake_no_worker(tmp_path: Path) -> None:
    running = RunningServer(delay_model(tmp_path, 200), ServerConfig(), tmp_path / "edged.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(30)
        sock.connect(str(tmp_path / "edged.sock"))
        request = raw_request()
        scheduler = running.service.record_for("tiny_d").versions[1].scheduler
        assert scheduler is not None
        for _ in range(SOLO_EVIDENCE):  # the first wait on a worker: too little seen yet, a burst may be beginning
            sock.sendall(request)
            assert read_status(sock) == b"HTTP/1.1 200 OK"
            for _ in range(30_000):  # the worker's bookkeeping ends after the answer
                if not scheduler.in_flight:
                    break
                threading.Event().wait(0.001)
        wakeups = scheduler.wakeups
        for _ in range(5):
            sock.sendall(request)
            assert read_status(sock) == b"HTTP/1.1 200 OK"
        assert scheduler.wakeups == wakeups  # each ran on the loop's thread once its delay was over
        stats = running.service.statistics("tiny_d")["model_stats"][0]
        assert (stats["inference_count"], stats["execution_count"]) == (SOLO_EVIDENCE + 5,) * 2
    finally:
        sock.close()
        running.stop()

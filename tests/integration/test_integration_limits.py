"""The real daemon under abuse through its socket: a SIGTERM under keep-alive load resets no client."""

from __future__ import annotations

import shutil
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from integration.edged_daemon import start_daemon
from modelgen import BUNDLED_MODELS

from edged.client import EdgedClient
from edged.protocol import encode_request

CLIENTS = 6
EXCHANGES_BEFORE_SIGTERM = 30  # per client: the load is on before the signal comes
DEADLINE_S = 60.0


def _requests() -> bytes:
    body, header = encode_request({"input": np.ones((1, 64), np.float32)})
    infer = (b"POST /v2/models/tiny_mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
             b"Inference-Header-Content-Length: %d\r\n\r\n" % (len(body), header)) + body
    return infer + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"  # two requests, pipelined


@dataclass
class Tally:
    exchanges: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    resets: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Reader:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def response(self) -> tuple[int, bool] | None:
        """(status, closes) of the next response; None on a clean EOF before it began."""
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                if self.buffer:
                    raise AssertionError(f"connection closed inside a response head: {self.buffer[:200]!r}")
                return None
            self.buffer += chunk
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.lower().split(b"\r\n")
        length = next(int(line.split(b":", 1)[1]) for line in lines if line.startswith(b"content-length:"))
        while len(self.buffer) < length:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AssertionError("connection closed inside a response body")
            self.buffer += chunk
        self.buffer = self.buffer[length:]
        return int(lines[0].split(b" ", 2)[1]), b"connection: close" in lines


def _client(path: str, payload: bytes, tally: Tally, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(20)
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            return  # the daemon stopped listening
        with sock:
            try:
                _keep_alive(sock, payload, tally, deadline)
            except (ConnectionResetError, BrokenPipeError) as e:
                with tally.lock:
                    tally.resets.append(repr(e))


def _keep_alive(sock: socket.socket, payload: bytes, tally: Tally, deadline: float) -> None:
    reader = _Reader(sock)
    while time.monotonic() < deadline:
        sock.sendall(payload)
        for _ in range(2):
            answer = reader.response()
            if answer is None:
                return  # closed between responses: what was not answered may be sent again
            status, closes = answer
            with tally.lock:
                tally.statuses[status] = tally.statuses.get(status, 0) + 1
                tally.exchanges += 1
            if closes:
                return


def test_sigterm_under_keep_alive_load_answers_or_closes_cleanly(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    repo.mkdir()
    shutil.copytree(BUNDLED_MODELS / "tiny_mlp", repo / "tiny_mlp")
    workdir = Path(tempfile.mkdtemp(prefix="edged-lim-", dir="/tmp"))  # AF_UNIX paths: 107 bytes at most
    daemon = start_daemon(workdir, config='[telemetry]\nsource = "off"\n',
                          args=["--model-repository", str(repo)])
    tally = Tally()
    deadline = time.monotonic() + DEADLINE_S
    threads = [threading.Thread(target=_client, args=(str(daemon.socket_path), _requests(), tally, deadline))
               for _ in range(CLIENTS)]
    try:
        for thread in threads:
            thread.start()
        while tally.exchanges < CLIENTS * EXCHANGES_BEFORE_SIGTERM and time.monotonic() < deadline:
            time.sleep(0.01)
        daemon.process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(DEADLINE_S)
        assert daemon.process.wait(30) == 0, daemon.output()
    finally:
        daemon.stop(5)
        shutil.rmtree(workdir, ignore_errors=True)
    assert tally.statuses.get(200, 0) >= CLIENTS * EXCHANGES_BEFORE_SIGTERM, tally.statuses
    assert set(tally.statuses) <= {200, 503}, tally.statuses
    assert tally.resets == [], f"{len(tally.resets)} clients were reset: {tally.resets[:3]}"


NOFILE = 320
FLOOD = 700


def _flood(path: str, count: int, deadline: float) -> list[socket.socket]:
    held: list[socket.socket] = []
    while len(held) < count:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)  # blocking: a full listen backlog makes connect wait, not fail
        except BlockingIOError:  # a Unix socket's backlog is full: the daemon is accepting, wait for it
            sock.close()
            assert time.monotonic() < deadline, f"only {len(held)} connections accepted"
            time.sleep(0.01)
            continue
        held.append(sock)
    return held


def _polite_request(path: str, deadline: float) -> tuple[int, bytes]:
    """GET /v2/health/live until an answer comes; a connection closed without one is tried again."""
    while True:
        assert time.monotonic() < deadline, "no answer before the deadline"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(20)
            try:
                sock.connect(path)
            except BlockingIOError:  # the listen backlog is full for a moment: a Unix socket says EAGAIN
                time.sleep(0.05)
                continue
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            reader = _Reader(sock)
            answer = reader.response()
            if answer is not None:
                return answer[0], reader.buffer
        time.sleep(0.05)


def _descriptors(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def test_a_connection_flood_gets_503_and_leaves_the_descriptor_reserve(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    repo.mkdir()
    shutil.copytree(BUNDLED_MODELS / "tiny_mlp", repo / "tiny_mlp")
    workdir = Path(tempfile.mkdtemp(prefix="edged-lim-", dir="/tmp"))
    config = '[telemetry]\nsource = "off"\n\n[server]\nmax_connections = 5000\nfd_reserve = 64\nlisten_backlog = 32\n'
    daemon = start_daemon(workdir, config=config, args=["--model-repository", str(repo)],
                          argv_prefix=["prlimit", f"--nofile={NOFILE}:{NOFILE}", "--"])
    path = str(daemon.socket_path)
    held: list[socket.socket] = []
    try:
        with EdgedClient(path) as client:
            limits = client.status()["limits"]
        assert limits["nofile"] == NOFILE and 0 < limits["max_connections"] < NOFILE - 64
        peak = 0
        for _ in range(FLOOD // 100):
            held += _flood(path, 100, time.monotonic() + DEADLINE_S)
            peak = max(peak, _descriptors(daemon.pid))
        status, _ = _polite_request(path, time.monotonic() + DEADLINE_S)
        peak = max(peak, _descriptors(daemon.pid))
        assert status == 503
        assert peak <= NOFILE - 64, f"{peak} descriptors open, the limit leaves {NOFILE - 64}"
        for sock in held:
            sock.close()
        held = []
        deadline = time.monotonic() + DEADLINE_S
        while _polite_request(path, deadline)[0] != 200:
            time.sleep(0.05)
    finally:
        for sock in held:
            sock.close()
        daemon.stop(10)
        output = daemon.output()
        shutil.rmtree(workdir, ignore_errors=True)
    assert "Too many open files" not in output

"""A real edged HTTP server on a real Unix socket and loopback TCP, with real onnxruntime models."""

from __future__ import annotations

import asyncio
import http.client
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

from edged.config import ModelsConfig, ServerConfig
from edged.engine import InferenceService
from edged.serving import HttpServer, Listener, open_listeners

MODELS = Path(__file__).resolve().parents[2] / "models"


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 10.0) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.unix_path)
        self.sock = sock


class RunningServer:
    def __init__(self, repo: Path, config: ServerConfig, socket_path: Path, models: ModelsConfig | None = None,
                 telemetry: Any = None) -> None:
        self.socket_path = socket_path
        self.config = config
        self.service = InferenceService(repo, models or ModelsConfig(), max_elements=config.max_tensor_elements)
        self.service.start()
        self.listeners: list[Listener] = open_listeners(config, socket_path, environ={})
        self.loop = uvloop.new_event_loop()
        self.server: HttpServer | None = None
        self._telemetry = telemetry
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        self.wait_ready()

    async def _start(self) -> None:
        self.server = HttpServer(self.service, self.config, telemetry=self._telemetry,
                                 status_provider=lambda: {"mqtt": {"connected": False}})
        await self.server.start([item.socket for item in self.listeners])

    @property
    def tcp_port(self) -> int:
        tcp = [item for item in self.listeners if item.kind == "tcp"]
        return int(tcp[0].address.rsplit(":", 1)[1])

    def connection(self, timeout: float = 10.0) -> UnixHTTPConnection:
        return UnixHTTPConnection(str(self.socket_path), timeout)

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        conn = self.connection()
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            conn.close()

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if self.request("GET", "/v2/health/ready")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.02)
        raise TimeoutError(f"server on {self.socket_path} not ready within {timeout_s} s")

    def stop(self, timeout_s: float = 2.0) -> None:
        if self.server is not None:
            asyncio.run_coroutine_threadsafe(self.server.stop(timeout_s), self.loop).result(timeout_s + 5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.service.close(2.0)


STRICT_PARAMETER = 'parameters { key: "reject_nonfinite_inputs" value: { string_value: "true" } }\n'


def make_repository(tmp: Path) -> Path:
    """tiny_mlp, and tiny_strict: the same network refusing NaN and Inf inputs."""
    repo = tmp / "repo"
    repo.mkdir()
    (repo / "tiny_mlp").symlink_to(MODELS / "tiny_mlp")
    strict = repo / "tiny_strict"
    (strict / "1").mkdir(parents=True)
    # a copy: a model file symlinked from outside its model folder is refused (edged.repository.confine)
    shutil.copyfile(MODELS / "tiny_mlp" / "1" / "model.onnx", strict / "1" / "model.onnx")
    config = (MODELS / "tiny_mlp" / "config.pbtxt").read_text().replace('"tiny_mlp"', '"tiny_strict"')
    (strict / "config.pbtxt").write_text(config + STRICT_PARAMETER)
    return repo


def make_server(tmp: Path, **overrides: Any) -> RunningServer:
    models = overrides.pop("models", None)
    telemetry = overrides.pop("telemetry", None)
    config = ServerConfig(**{"http_port": 0, **overrides})
    return RunningServer(make_repository(tmp), config, tmp / "edged.sock", models, telemetry)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = make_server(tmp_path_factory.mktemp("srv"), request_timeout_s=2.0, idle_timeout_s=30.0,
                          max_header_bytes=4096, max_body_bytes=1 << 20,
                          models=ModelsConfig(control_mode="explicit", startup_models=("*",)))
    yield running
    running.stop()

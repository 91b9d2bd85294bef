"""A real edged HTTP server for client, CLI and compatibility tests: the serving package and a real
InferenceService on (a subset of) the sample models, served on a real Unix socket, optionally also on loopback
TCP, from an event loop in a background thread. Readiness is waited for through the health route.

Loaded by path from the conftest files of tests/client and tests/compat (they are not packages).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from edged.client import ClientError, EdgedClient
from edged.config import ModelsConfig, ServerConfig
from edged.engine import InferenceService
from edged.serving import HttpServer
from edged.serving.listeners import unix_listener

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_MODELS = ROOT / "models"
EDGED = ROOT / ".venv" / "bin" / "edged"


def short_tempdir(prefix: str) -> str:
    """A directory under /tmp with a short path: AF_UNIX paths are limited to 107 bytes."""
    return tempfile.mkdtemp(prefix=prefix, dir="/tmp")


def make_repository(directory: str, models: tuple[str, ...]) -> Path:
    repository = Path(directory) / "models"
    repository.mkdir()
    for name in models:
        shutil.copytree(SAMPLE_MODELS / name, repository / name)
    return repository


class ThreadedServer:
    def __init__(self, models: tuple[str, ...] = ("tiny_mlp", "digits_onnx"), control_mode: str = "none",
                 startup_models: tuple[str, ...] = (), tcp: bool = False, idle_timeout_s: float = 300.0,
                 max_body_bytes: int = 64 * 1024 * 1024, tcp_restricted: dict[str, str] | None = None,
                 server_options: dict[str, Any] | None = None) -> None:
        self.directory = short_tempdir("edged-ct-")
        self.repository = make_repository(self.directory, models)
        self.socket_path = os.path.join(self.directory, "edged.sock")
        self.port: int | None = None
        self._tcp = tcp
        self._idle_timeout_s = idle_timeout_s
        self._max_body_bytes = max_body_bytes
        self._tcp_restricted = dict(tcp_restricted or {})
        self._server_options = dict(server_options or {})  # further ServerConfig fields
        self._models_config = ModelsConfig(control_mode=control_mode,  # type: ignore[arg-type]
                                           startup_models=startup_models)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="edged-test-server", daemon=True)
        self.service: InferenceService | None = None
        self._server: HttpServer | None = None

    def start(self, timeout_s: float = 30.0) -> ThreadedServer:
        tcp = [self._tcp_socket()] if self._tcp else []
        config = ServerConfig(socket=self.socket_path, http_port=self.port, idle_timeout_s=self._idle_timeout_s,
                              max_body_bytes=self._max_body_bytes, tcp_restricted=self._tcp_restricted,
                              **self._server_options)
        sockets = [unix_listener(config, Path(self.socket_path)).socket, *tcp]
        self.service = InferenceService(self.repository, self._models_config)
        self._server = HttpServer(self.service, config)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(sockets), self._loop).result(timeout_s)
        self._wait_ready(timeout_s)
        return self

    async def _start(self, sockets: list[socket.socket]) -> None:
        assert self.service is not None and self._server is not None
        await self._loop.run_in_executor(None, self.service.start)
        await self._server.start(sockets)

    def _tcp_socket(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        self.port = sock.getsockname()[1]
        return sock

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with EdgedClient(self.socket_path, timeout_s=5) as client:
            while time.monotonic() < deadline:
                try:
                    if client.ready():
                        return
                except ClientError:
                    pass
                time.sleep(0.02)
        raise TimeoutError(f"test server on {self.socket_path} not ready within {timeout_s} s")

    def stop(self) -> None:
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._server.stop(2.0), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if self.service is not None:
            self.service.close(5.0)
        self._loop.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def env(self, **extra: Any) -> dict[str, str]:
        """The environment for a CLI subprocess that should find this server only through $EDGED_SOCKET."""
        env = {k: v for k, v in os.environ.items() if k not in ("RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR")}
        env["EDGED_SOCKET"] = self.socket_path
        env.update({k: str(v) for k, v in extra.items()})
        return env

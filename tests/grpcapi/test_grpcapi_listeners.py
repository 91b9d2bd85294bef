"""The gRPC listeners and their config: loopback only unless opted in, a live socket is never taken over, a
stale one is replaced, bad sizes are refused, and [server.tcp_restricted] counts as used when gRPC listens on
TCP beside the HTTP Unix socket (never for the gRPC Unix socket, which judges peers)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from h2_raw import ENHANCE_YOUR_CALM, RawH2

from edged.config import ModelsConfig, ServerConfig, parse_config
from edged.engine import InferenceService
from edged.errors import ConfigError
from edged.grpcapi import GrpcServer
from edged.serving import HttpServer
from edged.shm import SharedMemoryRegistry


def _start(config: ServerConfig, repository: Path) -> None:
    async def run() -> None:
        server = GrpcServer(InferenceService(repository, ModelsConfig()), config, SharedMemoryRegistry())
        try:
            await server.start()
        finally:
            await server.stop(0)

    asyncio.run(run())


def test_a_non_loopback_grpc_host_is_refused_without_the_opt_in(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"server\.grpc_host '0\.0\.0\.0' is not a loopback address"):
        _start(ServerConfig(grpc_port=0, grpc_host="0.0.0.0"), tmp_path)


def test_a_live_socket_is_not_taken_over_and_a_stale_one_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "grpc.sock"
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(path))
    live.listen()
    try:
        with pytest.raises(ConfigError, match="another edged is listening"):
            _start(ServerConfig(grpc_socket=str(path)), tmp_path)
    finally:
        live.close()
    _start(ServerConfig(grpc_socket=str(path)), tmp_path)  # nothing answers now: replaced, then removed
    assert not path.exists()


def test_a_path_that_is_not_a_socket_is_refused(tmp_path: Path) -> None:
    (tmp_path / "grpc.sock").write_text("mine")
    with pytest.raises(ConfigError, match="exists and is not a socket"):
        _start(ServerConfig(grpc_socket=str(tmp_path / "grpc.sock")), tmp_path)


@pytest.mark.parametrize("text", ["grpc_max_message_mb = 0", "grpc_max_message_mb = 4096", "grpc_port = 70000"])
def test_bad_grpc_settings_are_config_errors(text: str) -> None:
    with pytest.raises(ConfigError, match=text.split(" = ", maxsplit=1)[0]):
        parse_config(f"[server]\n{text}\n")


def _http_start(config: ServerConfig, tmp_path: Path) -> None:
    server = HttpServer(InferenceService(tmp_path, ModelsConfig()), config)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(tmp_path / "edged.sock"))

    async def run() -> None:
        await server.start([sock])
        await server.stop(0)

    try:
        asyncio.run(run())
    finally:
        sock.close()


def test_tcp_restricted_with_only_a_grpc_tcp_listener_is_accepted_by_the_http_server(tmp_path: Path) -> None:
    _http_start(ServerConfig(grpc_port=0, tcp_restricted={"shared-memory": "edged-key=v"}), tmp_path)


def test_tcp_restricted_with_only_the_grpc_unix_socket_restricts_nothing_and_is_refused(tmp_path: Path) -> None:
    # the gRPC Unix socket judges callers by their credentials, as the HTTP one does: the key would do nothing
    config = ServerConfig(grpc_socket=str(tmp_path / "grpc.sock"), tcp_restricted={"shared-memory": "edged-key=v"})
    with pytest.raises(ConfigError, match=r"server\.tcp_restricted is set but edged has no TCP listener"):
        _http_start(config, tmp_path)


def test_the_grpc_front_end_runs_without_grpcio(tmp_path: Path) -> None:
    # grpcio is a test dependency only (tritonclient.grpc): the daemon's front end must not import it
    script = ("import asyncio, sys\n"
              "sys.modules['grpc'] = None  # any import of grpcio now fails\n"
              "from edged.config import ModelsConfig, ServerConfig\n"
              "from edged.engine import InferenceService\n"
              "from edged.grpcapi import GrpcServer\n"
              "from edged.shm import SharedMemoryRegistry\n"
              "async def main():\n"
              f"    server = GrpcServer(InferenceService({str(tmp_path)!r}, ModelsConfig()),\n"
              "                        ServerConfig(grpc_port=0), SharedMemoryRegistry())\n"
              "    await server.start()\n"
              "    print(server.addresses)\n"
              "    await server.stop(0)\n"
              "asyncio.run(main())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and "127.0.0.1:" in done.stdout, done.stderr


def test_connections_beyond_max_connections_get_goaway(tmp_path: Path) -> None:
    path = tmp_path / "grpc.sock"

    async def run() -> None:
        server = GrpcServer(InferenceService(tmp_path, ModelsConfig()),
                            ServerConfig(grpc_socket=str(path), max_connections=2), SharedMemoryRegistry())
        await server.start()
        try:
            await asyncio.get_running_loop().run_in_executor(None, _connect_three, path)
        finally:
            await server.stop(1)

    asyncio.run(run())


def _connect_three(path: Path) -> None:
    first, second = RawH2.unix(path), RawH2.unix(path)
    for client in (first, second):
        client.start()
        assert client.call(1, "ServerLive", b"")[0][b"grpc-status"] == b"0"
    with RawH2.unix(path) as third:
        third.start()
        assert third.goaway().code == ENHANCE_YOUR_CALM
    first.sock.close()
    for _ in range(100):  # a slot is free again once the server has seen a connection go
        with RawH2.unix(path) as fourth:
            fourth.start()
            try:
                fields, _ = fourth.call(1, "ServerLive", b"")
            except AssertionError:  # refused: the server has not yet seen the close
                time.sleep(0.05)
                continue
            assert fields[b"grpc-status"] == b"0"
            break
    else:
        raise AssertionError("no connection was accepted after one of the two closed")
    second.sock.close()

"""One real daemon (a subprocess) serving gRPC on a loopback port and on a Unix socket, for the gRPC tests.

The port is chosen by the daemon (``grpc_port = 0``) and read back from its status document, so there is no
race for a free port. Shared memory and repository changes are configured with ``[server.tcp_restricted]``
keys, which the tests send as gRPC metadata.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from grpcapi_daemon import MAX_MESSAGE_MB, SHM_KEY, GrpcDaemon
from integration.edged_daemon import config_with_fakes, start_daemon


@pytest.fixture(scope="module")
def grpc_daemon(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[GrpcDaemon]:
    workdir = tmp_path_factory.mktemp("grpc")
    socket_path = workdir / "grpc.sock"
    config = config_with_fakes(
        f'[server]\ngrpc_port = 0\ngrpc_socket = "{socket_path}"\ngrpc_max_message_mb = {MAX_MESSAGE_MB}\n'
        'socket_mode = "0600"\n\n'
        f'[server.tcp_restricted]\nshared-memory = "{SHM_KEY[0]}={SHM_KEY[1]}"\n'
        f'model-repository = "{SHM_KEY[0]}={SHM_KEY[1]}"\n')
    daemon = start_daemon(workdir, config=config, args=["--model-control-mode", "explicit"])
    try:
        client = daemon.client()
        listeners = client.status()["grpc_listeners"]
        for name in ("tiny_mlp", "camera_frame"):
            client.load(name)
        tcp = next(address for address in listeners if not address.startswith("unix:"))
        yield GrpcDaemon(daemon, tcp, f"unix://{socket_path}", socket_path)
    finally:
        daemon.stop()

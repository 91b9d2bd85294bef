"""Socket activation of the gRPC Unix socket, with no systemd: the daemon started as systemd starts it, with
LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES set and the sockets at descriptors 3, 4, ... (tests/activation.py).

edged takes the descriptor named ``grpc`` (edged-grpc.socket) for gRPC and the one named ``edged``
(edged.socket) for HTTP; with only the HTTP one passed it creates the gRPC socket itself; a name it does not
know, or a gRPC socket it was not configured for, stops the start with an error naming what to fix.
"""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import pytest
import tritonclient.grpc as triton_grpc
from activation import wrapper
from h2_raw import RawH2
from integration.edged_daemon import DaemonProcess, config_with_fakes, start_daemon

from edged.grpcapi.proto import grpc_service_pb2 as pb


def _listening(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(16)
    return sock


def _activated(workdir: Path, config: str, names: str, *sockets: socket.socket) -> DaemonProcess:
    """The daemon with ``sockets`` passed as systemd passes them, under ``names`` (LISTEN_FDNAMES)."""
    env = {"LISTEN_FDS": str(len(sockets)), "LISTEN_FDNAMES": names}
    fds = [sock.fileno() for sock in sockets]
    daemon = start_daemon(workdir, config=config_with_fakes(config), env=env, socket_name="not-used.sock",
                          wait=False, pass_fds=fds, argv_prefix=wrapper("LISTEN_PID", *fds))
    daemon.socket_path = Path(sockets[0].getsockname())  # the harness reaches it on the inherited HTTP socket
    for sock in sockets:
        sock.close()  # the daemon holds the only copies now, as with systemd's socket units
    return daemon


def _failed_start(daemon: DaemonProcess) -> str:
    assert daemon.process.wait(60) != 0, daemon.output()
    return daemon.output()


def test_the_grpc_socket_passed_by_name_is_served_and_outlives_the_daemon(tmp_path: Path) -> None:
    http_path, grpc_path = tmp_path / "edged.sock", tmp_path / "grpc.sock"
    http, grpc = _listening(http_path), _listening(grpc_path)
    grpc_path.chmod(0o640)  # the socket unit's mode, which edged must leave alone (socket_mode is 0660)
    early = RawH2.unix(grpc_path)  # a client connecting before the daemon exists is queued, not refused
    early.start()
    daemon = _activated(tmp_path / "d", f'[server]\ngrpc_socket = "{grpc_path}"\n', "edged:grpc", http, grpc)
    try:
        daemon.wait_ready()
        fields, body = early.call(1, "ServerLive", pb.ServerLiveRequest().SerializeToString())
        assert fields[b"grpc-status"] == b"0" and pb.ServerLiveResponse.FromString(body).live
        assert triton_grpc.InferenceServerClient(f"unix://{grpc_path}").is_server_live()
        status = daemon.client().status()
        assert status["grpc"]["activated"] == [f"unix:{grpc_path}"]
        assert status["grpc_listeners"] == [f"unix:{grpc_path}"]
        assert f"listening on grpc:unix:{grpc_path} (inherited from systemd)" in daemon.output()
        assert f"listening on uds:{http_path} (inherited from systemd)" in daemon.output()
        assert stat.S_IMODE(grpc_path.stat().st_mode) == 0o640
    finally:
        early.sock.close()
        assert daemon.stop() == 0, daemon.output()
    assert grpc_path.exists(), "the inherited socket's file belongs to the socket unit"


def test_with_only_the_http_socket_passed_edged_creates_the_grpc_socket(tmp_path: Path) -> None:
    http_path, grpc_path = tmp_path / "edged.sock", tmp_path / "grpc.sock"
    daemon = _activated(tmp_path / "d", f'[server]\ngrpc_socket = "{grpc_path}"\n', "edged", _listening(http_path))
    try:
        daemon.wait_ready()
        assert triton_grpc.InferenceServerClient(f"unix://{grpc_path}").is_server_live()
        assert daemon.client().status()["grpc"]["activated"] == []
        assert f"listening on grpc:unix:{grpc_path} (opened)" in daemon.output()
        assert stat.S_IMODE(grpc_path.stat().st_mode) == 0o660  # socket_mode's default
    finally:
        assert daemon.stop() == 0, daemon.output()
    assert not grpc_path.exists(), "a socket edged created is removed at stop"


def test_a_descriptor_name_edged_does_not_know_stops_the_start_naming_it(tmp_path: Path) -> None:
    daemon = _activated(tmp_path / "d", "", "edged:metrics", _listening(tmp_path / "edged.sock"),
                        _listening(tmp_path / "other.sock"))
    output = _failed_start(daemon)
    assert "systemd passed sockets named 'metrics' (LISTEN_FDNAMES)" in output
    assert "set FileDescriptorName= in that socket unit" in output


@pytest.mark.parametrize(("config", "expected"), [
    ("", "systemd passed a gRPC socket ('grpc', edged-grpc.socket) but gRPC is off"),
    ('[server]\ngrpc_socket = "/elsewhere/grpc.sock"\n', "but server.grpc_socket is '/elsewhere/grpc.sock'"),
])
def test_a_grpc_socket_edged_was_not_configured_for_stops_the_start(tmp_path: Path, config: str,
                                                                    expected: str) -> None:
    daemon = _activated(tmp_path / "d", config, "edged:grpc", _listening(tmp_path / "edged.sock"),
                        _listening(tmp_path / "grpc.sock"))
    assert expected in _failed_start(daemon)

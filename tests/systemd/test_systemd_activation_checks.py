"""What a real ``edged serve`` does with the sockets systemd passes when they are not what edged can serve on
safely: a TCP socket on every address (``ListenStream=8000``) is refused unless
``server.http_allow_non_loopback`` is set, as the configured port is; a descriptor that is not a listening
stream socket is refused in one line naming it, never with a traceback (tests/activation.py passes them).
"""

from __future__ import annotations

import http.client
import os
import socket
from pathlib import Path

import pytest
from activation import wrapper
from integration.edged_daemon import DaemonProcess, config_with_fakes, start_daemon

CONFIG_ERROR_EXIT = 1  # what `edged serve` exits with on any ConfigError (edged.cli.main)


def _unix_listening(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(16)
    return sock


def _tcp_listening(host: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    if ":" in host:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.bind((host, 0))
    sock.listen(16)
    return sock


def _activated(workdir: Path, fds: list[int], names: str, config: str = "",
               listen_fds: int | None = None) -> DaemonProcess:
    env = {"LISTEN_FDS": str(len(fds) if listen_fds is None else listen_fds), "LISTEN_FDNAMES": names}
    return start_daemon(workdir, config=config_with_fakes(config), env=env, socket_name="not-used.sock",
                        wait=False, pass_fds=fds, argv_prefix=wrapper("LISTEN_PID", *fds))


def _refusal(daemon: DaemonProcess) -> str:
    """The one error line of a start that was refused."""
    assert daemon.process.wait(60) == CONFIG_ERROR_EXIT, daemon.output()
    output = daemon.output()
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("edged serve: error: ")]
    assert len(errors) == 1, output
    return errors[0]


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_an_inherited_tcp_socket_on_every_address_is_refused_naming_it_and_the_key(tmp_path: Path,
                                                                                    host: str) -> None:
    unix, tcp = _unix_listening(tmp_path / "edged.sock"), _tcp_listening(host)
    port = tcp.getsockname()[1]
    try:
        daemon = _activated(tmp_path / "d", [unix.fileno(), tcp.fileno()], "edged:edged")
        line = _refusal(daemon)
    finally:
        unix.close()
        tcp.close()
    assert f"fd 4 (edged) listens on {host}:{port}, not a loopback address" in line
    assert "server.http_allow_non_loopback = true" in line
    assert f"ListenStream=127.0.0.1:{port}" in line


def test_an_inherited_tcp_socket_named_grpc_is_refused_as_grpc_tcp_is_never_socket_activated(
        tmp_path: Path) -> None:
    unix, tcp = _unix_listening(tmp_path / "edged.sock"), _tcp_listening("0.0.0.0")
    port = tcp.getsockname()[1]
    config = f'[server]\ngrpc_socket = "{tmp_path / "grpc.sock"}"\n'
    try:
        line = _refusal(_activated(tmp_path / "d", [unix.fileno(), tcp.fileno()], "edged:grpc", config))
    finally:
        unix.close()
        tcp.close()
    assert f"passed as 'grpc' (fd 4, 0.0.0.0:{port}) is not a Unix stream socket" in line
    assert "never socket-activated" in line


def _get_live(host: str, port: int) -> int:
    connection = http.client.HTTPConnection(host, port, timeout=30)
    try:
        connection.request("GET", "/v2/health/live")
        return connection.getresponse().status
    finally:
        connection.close()


@pytest.mark.parametrize(("hosts", "config"), [
    (["127.0.0.1", "::1"], ""),  # loopback needs no key
    (["0.0.0.0"], "[server]\nhttp_allow_non_loopback = true\n"),  # every address, as the key allows
])
def test_inherited_tcp_sockets_on_loopback_or_allowed_are_served(tmp_path: Path, hosts: list[str],
                                                                 config: str) -> None:
    unix = _unix_listening(tmp_path / "edged.sock")
    tcp = [_tcp_listening(host) for host in hosts]
    ports = [sock.getsockname()[1] for sock in tcp]
    names = ":".join(["edged"] * (1 + len(tcp)))
    daemon = _activated(tmp_path / "d", [unix.fileno(), *(sock.fileno() for sock in tcp)], names, config)
    daemon.socket_path = tmp_path / "edged.sock"  # the harness reaches it on the inherited Unix socket
    for sock in [unix, *tcp]:
        sock.close()  # the daemon holds the only copies now, as with systemd's socket unit
    try:
        daemon.wait_ready()
        for host, port in zip(hosts, ports, strict=True):
            assert _get_live("127.0.0.1" if host == "0.0.0.0" else host, port) == 200
            assert f"listening on tcp:{host}:{port} (inherited from systemd)" in daemon.output()
    finally:
        assert daemon.stop() == 0, daemon.output()


def _passed(kind: str, tmp_path: Path) -> int:
    """A descriptor of ``kind``, none of which edged can serve on."""
    if kind == "regular file":
        path = tmp_path / "plain"
        path.write_text("not a socket")
        return os.open(path, os.O_RDONLY)
    if kind == "datagram":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(tmp_path / "dgram.sock"))
    elif kind == "bound, not listening":
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
    else:  # "never bound"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    return sock.detach()


@pytest.mark.parametrize(("kind", "name", "expected"), [
    ("regular file", "edged", "fd 3 (edged, one of LISTEN_FDS=1) is not a socket (a regular file)"),
    ("datagram", "grpc", "fd 3 (grpc, one of LISTEN_FDS=1) is a Unix SOCK_DGRAM socket, not SOCK_STREAM"),
    ("never bound", "edged", "fd 3 (edged, one of LISTEN_FDS=1) is a Unix stream socket that is not listening"),
    ("bound, not listening", "", "fd 3 (unnamed, one of LISTEN_FDS=1) is an IPv4 stream socket that is not "
                                 "listening"),
])
def test_a_descriptor_that_is_not_a_listening_stream_socket_stops_the_start_naming_it(
        tmp_path: Path, kind: str, name: str, expected: str) -> None:
    fd = _passed(kind, tmp_path)
    try:
        line = _refusal(_activated(tmp_path / "d", [fd], name))
    finally:
        os.close(fd)
    assert f"socket activation: {expected}" in line
    unit = {"edged": "edged.socket", "grpc": "edged-grpc.socket"}.get(name, "the .socket unit that passes it")
    assert f"check ListenStream= in {unit}" in line


def test_listen_fds_counting_more_descriptors_than_were_passed_stops_the_start_naming_the_first_missing(
        tmp_path: Path) -> None:
    unix = _unix_listening(tmp_path / "edged.sock")
    try:
        line = _refusal(_activated(tmp_path / "d", [unix.fileno()], "edged:edged", listen_fds=2))
    finally:
        unix.close()
    assert "socket activation: fd 4 (edged, one of LISTEN_FDS=2) is not " in line
    assert "that LISTEN_FDS counts only the sockets passed" in line

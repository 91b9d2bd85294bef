"""gRPC connection slots under abuse, on a spawned daemon with a small ``max_connections``: a connection that
never sends the HTTP/2 preface is closed within a few seconds (not after ``idle_timeout_s``), and loopback TCP
connections that fill the limit leave the Unix socket its reserved slots."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from h2_raw import ENHANCE_YOUR_CALM, PROTOCOL_ERROR, RawH2
from integration.edged_daemon import DaemonProcess, config_with_fakes, start_daemon

from edged.grpcapi.proto import grpc_service_pb2 as pb

MAX_CONNECTIONS = 8  # TCP may take 7 of them: one (an eighth, at least one) is kept for the Unix socket


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, str, Path]]:
    workdir = tmp_path_factory.mktemp("grpc-slots")
    socket_path = workdir / "grpc.sock"
    # idle_timeout_s far off: only the preface timeout (request_timeout_s, 2 s, is shorter than 5 s) can close
    config = config_with_fakes(f'[server]\ngrpc_port = 0\ngrpc_socket = "{socket_path}"\nsocket_mode = "0600"\n'
                               f'max_connections = {MAX_CONNECTIONS}\nrequest_timeout_s = 2\nidle_timeout_s = 600\n')
    process = start_daemon(workdir / "run", config=config)
    try:
        listeners = process.client().status()["grpc_listeners"]
        yield process, next(a for a in listeners if not a.startswith("unix:")), socket_path
    finally:
        process.stop()


def _live(client: RawH2) -> None:
    fields, body = client.call(1, "ServerLive", pb.ServerLiveRequest().SerializeToString())
    assert fields[b"grpc-status"] == b"0" and pb.ServerLiveResponse.FromString(body).live


def test_a_connection_that_sends_no_preface_is_closed(daemon: tuple[DaemonProcess, str, Path]) -> None:
    _, address, _ = daemon
    with RawH2(address) as silent, RawH2(address) as partial:
        partial.send(b"PRI * HTTP/2.0\r\n")  # a preface begun and never finished
        for client in (silent, partial):
            assert client.goaway().code == PROTOCOL_ERROR  # then closed: goaway() reads to the end


def test_tcp_connections_at_the_limit_leave_the_unix_socket_its_slot(daemon: tuple[DaemonProcess, str, Path]) -> None:
    _, address, socket_path = daemon
    held: list[RawH2] = []
    try:
        for _ in range(MAX_CONNECTIONS - 1):  # HTTP/2 connections that stay open (idle_timeout_s is 600 s)
            client = RawH2(address)
            held.append(client)
            client.start()
            _live(client)
        with RawH2(address) as refused:  # one TCP connection more is refused
            refused.start()
            assert refused.goaway().code == ENHANCE_YOUR_CALM
        with RawH2(str(socket_path), family=socket.AF_UNIX) as local:  # the Unix socket is still served
            local.start()
            _live(local)
    finally:
        for client in held:
            client.sock.close()

"""Socket and network checks of ``edged doctor``: where the daemon's socket is, who may use it, whether a
daemon answers on it, whether its gRPC listeners speak HTTP/2, and whether the configured MQTT broker can be
reached."""

from __future__ import annotations

import dataclasses
import grp
import http.client
import os
import socket
import stat
from collections.abc import Mapping

from edged.cli._doctor_checks import Check, broker_address
from edged.client import UnixHTTPConnection, find_sockets
from edged.config import ServerConfig

PROBE_TIMEOUT_S = 2.0
# HTTP/2's client connection preface and an empty SETTINGS frame (RFC 9113 §3.4): a gRPC server answers with
# its own SETTINGS frame first, which is all the probe needs (no gRPC client library at run time).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_SETTINGS = 0x4


def find_socket(explicit: str | None, env: Mapping[str, str]) -> tuple[str | None, list[str]]:
    """The socket every edged command would use (the explicit one, else the first that exists), and every
    candidate tried; the search order is the client's own."""
    search = find_sockets(explicit, env)
    chosen = explicit or next(iter(search.existing), None)
    return chosen, list(search.candidates)


def check_socket_permissions(path: str) -> Check:
    try:
        info = os.stat(path)
    except OSError as e:
        return Check("socket", "fail", f"{path}: {e.strerror}",
                     "start the daemon: sudo systemctl start edged (or `edged serve`)")
    if not stat.S_ISSOCK(info.st_mode):
        return Check("socket", "fail", f"{path} is not a socket", f"remove {path} and restart the daemon")
    mode = stat.S_IMODE(info.st_mode)
    group = _group_name(info.st_gid)
    detail = f"{path} mode {mode:04o} group {group}"
    if mode & 0o007:
        return Check("socket", "warn", detail + ": any local user may call the API",
                     "set SocketMode=0660 (edged.socket) or [server] socket_mode = \"0660\"")
    if not os.access(path, os.R_OK | os.W_OK):
        return Check("socket", "fail", detail + ": this user may not connect",
                     f"sudo usermod -aG {group} $USER, then log in again")
    return Check("socket", "ok", detail)


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def check_daemon(path: str) -> Check:
    connection = UnixHTTPConnection(path, PROBE_TIMEOUT_S)
    try:
        connection.request("GET", "/v2/health/ready")
        response = connection.getresponse()
        response.read()
    except (OSError, http.client.HTTPException) as e:
        reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
        return Check("daemon", "fail", f"nothing answers on {path}: {reason}",
                     "start the daemon: sudo systemctl start edged; if it is running, see journalctl -u edged")
    finally:
        connection.close()
    if response.status == 200:
        return Check("daemon", "ok", f"ready (GET /v2/health/ready on {path}: 200)")
    return Check("daemon", "warn", f"answers but is not ready (HTTP {response.status}): models still loading "
                 "or failed", "edged models (or journalctl -u edged) shows which model is not ready")


def check_grpc(server: ServerConfig) -> list[Check]:
    """The gRPC listeners of ``[server]``: the socket's permissions as for the HTTP socket, and whether an HTTP/2
    server answers on each (the daemon creates them itself, so they are absent while it restarts)."""
    if server.grpc_socket is None and server.grpc_port is None:
        return [Check("gRPC", "info", "gRPC is off ([server] grpc_port and grpc_socket are not set)")]
    found: list[Check] = []
    if server.grpc_socket is not None:
        permissions = check_socket_permissions(server.grpc_socket)
        found.append(dataclasses.replace(permissions, name="gRPC socket"))
        if permissions.status != "fail":
            found.append(_probe_h2(f"unix:{server.grpc_socket}", socket.AF_UNIX, server.grpc_socket))
    if server.grpc_port is not None:
        family = socket.AF_INET6 if ":" in server.grpc_host else socket.AF_INET
        found.append(_probe_h2(f"{server.grpc_host}:{server.grpc_port}", family,
                               (server.grpc_host, server.grpc_port)))
    return found


def _probe_h2(name: str, family: socket.AddressFamily, address: str | tuple[str, int]) -> Check:
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(PROBE_TIMEOUT_S)
            sock.connect(address)
            sock.sendall(_H2_PREFACE)
            head = b""
            while len(head) < 9:
                chunk = sock.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
    except OSError as e:
        reason = e.strerror or str(e) or type(e).__name__
        return Check("gRPC daemon", "fail", f"nothing answers gRPC on {name}: {reason}",
                     "start the daemon: sudo systemctl start edged; if it is running, see journalctl -u edged "
                     "(and edged.toml's [server] grpc_port / grpc_socket)")
    if len(head) == 9 and head[3] == _H2_SETTINGS:
        return Check("gRPC daemon", "ok", f"HTTP/2 answers on {name} (the server's SETTINGS frame)")
    return Check("gRPC daemon", "fail", f"{name} answers, but not as an HTTP/2 server (first bytes {head[:9]!r})",
                 "another program holds this address: stop it, or change [server] grpc_port / grpc_socket")


def check_broker(url: str | None) -> Check:
    if not url:
        return Check("MQTT broker", "info", "MQTT is off ([mqtt] broker is not set)")
    try:
        host, port = broker_address(url)
    except ValueError as e:
        return Check("MQTT broker", "fail", f"[mqtt] broker: {e}", "set [mqtt] broker = \"mqtt://host:1883\"")
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            pass
    except OSError as e:
        reason = e.strerror or str(e) or type(e).__name__
        return Check("MQTT broker", "fail", f"cannot connect to {host}:{port}: {reason}",
                     "check that the broker runs and [mqtt] broker in edged.toml; check firewalls and DNS")
    return Check("MQTT broker", "ok", f"TCP connect to {host}:{port} succeeded")

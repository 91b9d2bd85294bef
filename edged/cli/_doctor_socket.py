"""Socket and network checks of ``edged doctor``: where the daemon's socket is, who may use it, whether a
daemon answers on it, and whether the configured MQTT broker can be reached."""

from __future__ import annotations

import grp
import http.client
import os
import socket
import stat
from collections.abc import Mapping

from edged.cli._doctor_checks import Check, broker_address
from edged.client import UnixHTTPConnection, find_sockets

PROBE_TIMEOUT_S = 2.0


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

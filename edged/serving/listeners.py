"""The sockets the server listens on: a Unix socket, systemd-activated sockets, and optional loopback TCP.

A Unix socket is bound under a restrictive umask (0o177), so it is never reachable by others between bind and
chmod; only then is it given ``socket_mode`` and ``socket_group``. An existing socket file is replaced only
when nothing answers on it (a live daemon would otherwise lose its socket). Inherited sockets (LISTEN_FDS)
are used only when LISTEN_PID names this process, as sd_listen_fds(3) requires, and only those systemd named
for the HTTP API (`edged.access.activated_sockets`: a socket named ``grpc`` is the gRPC front end's). An
inherited TCP socket follows the configured port's rule: the HTTP listener has no access control, so one bound
to a non-loopback address (``ListenStream=8000`` binds every address) is refused unless
``http_allow_non_loopback`` is set.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edged.access import BIND_UMASK as _BIND_UMASK
from edged.access import Activated, activated_sockets, next_step, set_mode_and_group
from edged.access import is_loopback as _is_loopback
from edged.access import remove_stale as _remove_stale
from edged.config import ServerConfig
from edged.errors import ConfigError

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Listener:
    socket: socket.socket
    kind: Literal["uds", "tcp"]
    address: str
    inherited: bool = False


def default_socket_path(environ: Mapping[str, str] = os.environ) -> Path:
    """$RUNTIME_DIRECTORY/edged.sock, else $XDG_RUNTIME_DIR/edged/edged.sock, else /tmp/edged-$UID/edged.sock."""
    runtime = environ.get("RUNTIME_DIRECTORY", "")
    xdg = environ.get("XDG_RUNTIME_DIR", "")
    if runtime:
        directory = Path(runtime.split(":")[0])
    elif xdg:
        directory = Path(xdg) / "edged"
    else:
        directory = Path(f"/tmp/edged-{os.getuid()}")
    _private_directory(directory)
    return directory / "edged.sock"


def _private_directory(directory: Path) -> None:
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = directory.lstat()
    except OSError as e:
        raise ConfigError(f"cannot create the socket directory {directory}: {e.strerror}") from e
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise ConfigError(f"socket directory {directory} is not a directory owned by uid {os.getuid()} "
                          f"(owner uid {info.st_uid}); refusing to use it")
    if info.st_mode & 0o022:
        raise ConfigError(f"socket directory {directory} is writable by others (mode {info.st_mode & 0o777:04o}); "
                          "expected 0700")


def open_listeners(config: ServerConfig, socket_path: Path, environ: Mapping[str, str] = os.environ,
                   activated: Activated | None = None) -> list[Listener]:
    """Inherited sockets when systemd passed some for the HTTP API, else a new Unix socket; plus TCP if set.
    ``activated``: the sockets the daemon took from systemd (else they are read from ``environ`` here)."""
    listeners = inherited_listeners(config, activated if activated is not None else activated_sockets(environ))
    if not listeners:
        listeners = [unix_listener(config, socket_path)]
    if config.http_port is not None and not any(item.kind == "tcp" for item in listeners):
        try:
            listeners.append(tcp_listener(config))
        except BaseException:
            for item in listeners:
                item.socket.close()
            raise
    return listeners


def inherited_listeners(config: ServerConfig, activated: Activated) -> list[Listener]:
    """The HTTP API's sockets among those systemd passed (named ``edged`` or unnamed: `activated_sockets`)."""
    listeners = []
    for name, sock in activated.http:
        if sock.family == socket.AF_UNIX:
            address = str(sock.getsockname()) or name
            listeners.append(Listener(sock, "uds", address, inherited=True))
        elif sock.family in (socket.AF_INET, socket.AF_INET6):
            host, port = sock.getsockname()[:2]
            if not config.http_allow_non_loopback and not _is_loopback(host):
                fd = sock.fileno()
                for _, each in activated.http:
                    each.close()
                raise ConfigError(f"the TCP socket systemd passed as fd {fd} ({name or 'unnamed'}) listens on "
                                  f"{host}:{port}, not a loopback address; the HTTP listener has no access "
                                  f"control, so bind it to loopback (ListenStream=127.0.0.1:{port}) or set "
                                  "server.http_allow_non_loopback = true")
            listeners.append(Listener(sock, "tcp", f"{host}:{port}", inherited=True))
        else:
            fd = sock.detach()
            raise ConfigError(f"inherited socket {fd} ({name or 'unnamed'}) has address family {sock.family}; "
                              "expected a Unix or TCP stream socket")
    return listeners


def unix_listener(config: ServerConfig, path: Path) -> Listener:
    _remove_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        previous = os.umask(_BIND_UMASK)
        try:
            sock.bind(str(path))
        finally:
            os.umask(previous)
        set_mode_and_group(path, config.socket_mode, config.socket_group)
        sock.listen(config.listen_backlog)
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on Unix socket {path}: {e.strerror or e}"
                          f"{next_step(e, path, 'server.socket, --socket')}") from e
    except BaseException:
        sock.close()
        raise
    return Listener(sock, "uds", str(path))


def tcp_listener(config: ServerConfig) -> Listener:
    host = config.http_host
    if not config.http_allow_non_loopback and not _is_loopback(host):
        raise ConfigError(f"server.http_host {host!r} is not a loopback address; the HTTP listener has no access "
                          "control, so it listens on loopback only unless server.http_allow_non_loopback = true")
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, config.http_port or 0), family=family,
                                    backlog=config.listen_backlog)
    except OSError as e:
        raise ConfigError(f"cannot listen on {host}:{config.http_port}: {e.strerror or e}"
                          f"{next_step(e, None, 'server.http_port, --http-port')}") from e
    bound_host, port = sock.getsockname()[:2]
    return Listener(sock, "tcp", f"{bound_host}:{port}")

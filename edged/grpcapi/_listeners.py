"""The gRPC front end's listening sockets: loopback TCP, and the Unix socket, adopted from systemd or created.

- ``[server] grpc_port``: loopback TCP on ``grpc_host`` (a non-loopback host only with
  ``http_allow_non_loopback``, the HTTP listener's opt-in).
- ``[server] grpc_socket``: the socket systemd passed under the name ``grpc`` (``edged-grpc.socket``), so
  clients are queued while the daemon restarts; its path must be the configured one, and its file, mode and
  group are the socket unit's (edged neither changes nor removes them). Without one, edged creates the
  socket itself: bound under a 0o177 umask, then given ``socket_mode`` and ``socket_group``, removed at stop;
  it is then absent while the daemon restarts. A ``grpc`` socket passed while ``grpc_socket`` is not set is a
  ConfigError: nothing would answer the clients systemd queues on it.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from edged.access import BIND_UMASK, GRPC_NAME, is_loopback, next_step, remove_stale, set_mode_and_group
from edged.config import ServerConfig
from edged.errors import ConfigError


@dataclass(frozen=True)
class GrpcListener:
    socket: socket.socket
    address: str  # "host:port" or "unix:/path"
    inherited: bool = False
    created: tuple[Path, int] | None = None  # a socket file this process bound, and its inode


def open_grpc_listeners(config: ServerConfig, inherited: list[tuple[str, socket.socket]]) -> list[GrpcListener]:
    listeners: list[GrpcListener] = []
    try:
        if config.grpc_port is not None:
            sock = tcp_socket(config)
            listeners.append(GrpcListener(sock, f"{config.grpc_host}:{sock.getsockname()[1]}"))
        adopted = adopt(config, inherited)
        if adopted is not None:
            listeners.append(adopted)
        elif config.grpc_socket is not None:
            path = Path(config.grpc_socket)
            sock = unix_socket(config, path)
            listeners.append(GrpcListener(sock, f"unix:{path}", created=(path, path.lstat().st_ino)))
    except BaseException:
        for item in listeners:
            item.socket.close()
        for _, sock in inherited:
            sock.close()
        raise
    return listeners


def adopt(config: ServerConfig, inherited: list[tuple[str, socket.socket]]) -> GrpcListener | None:
    """The ``grpc`` socket systemd passed, checked against ``grpc_socket``; None when none was passed."""
    if not inherited:
        return None
    if len(inherited) > 1:
        raise ConfigError(f"systemd passed {len(inherited)} sockets named {GRPC_NAME!r}; edged serves gRPC on one "
                          "Unix socket (server.grpc_socket): give edged-grpc.socket one ListenStream=")
    _, sock = inherited[0]
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        # never adopted at any address, loopback or not: gRPC TCP is only grpc_port, which follows the loopback rule
        address = sock.getsockname()
        where = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else repr(address)
        raise ConfigError(f"the socket systemd passed as {GRPC_NAME!r} (fd {sock.fileno()}, {where}) is not a Unix "
                          f"stream socket (family {sock.family!r}); the gRPC TCP port is server.grpc_port, never "
                          "socket-activated: give edged-grpc.socket a ListenStream= path")
    path = str(sock.getsockname())
    if config.grpc_socket is None:
        raise ConfigError(f"systemd passed a gRPC socket ({GRPC_NAME!r}, {path}) but server.grpc_socket is not "
                          f'set: set server.grpc_socket = "{path}", or disable edged-grpc.socket')
    if os.path.abspath(config.grpc_socket) != path:
        raise ConfigError(f"systemd passed the gRPC socket {path} ({GRPC_NAME!r}) but server.grpc_socket is "
                          f"{config.grpc_socket!r}: make them the same path")
    return GrpcListener(sock, f"unix:{path}", inherited=True)


def tcp_socket(config: ServerConfig) -> socket.socket:
    host = config.grpc_host
    if not config.http_allow_non_loopback and not is_loopback(host):
        raise ConfigError(f"server.grpc_host {host!r} is not a loopback address; it listens on loopback only "
                          "unless server.http_allow_non_loopback = true")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, config.grpc_port or 0), family=family)
    except OSError as e:
        raise ConfigError(f"cannot listen for gRPC on {host}:{config.grpc_port}: {e.strerror}"
                          f"{next_step(e, None, 'server.grpc_port, --grpc-port')}") from e


def unix_socket(config: ServerConfig, path: Path) -> socket.socket:
    remove_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    previous = os.umask(BIND_UMASK)  # the file is created by bind: never world-writable, even briefly
    try:
        sock.bind(str(path))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen for gRPC on Unix socket {path}: {e.strerror}"
                          f"{next_step(e, path, 'server.grpc_socket, --grpc-socket')}") from e
    finally:
        os.umask(previous)
    try:
        set_mode_and_group(path, config.socket_mode, config.socket_group)
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot set the mode or group of gRPC socket {path}: {e.strerror}") from e
    except BaseException:  # an unknown socket_group
        sock.close()
        raise
    return sock

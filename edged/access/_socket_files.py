"""Socket files and listen addresses, shared by the front ends that create their own sockets (HTTP, gRPC).

A Unix socket is bound under ``BIND_UMASK`` (0o177), so it is never reachable by others between bind and
chmod; only then is it given its mode and group. An existing socket file is replaced only when nothing
answers on it: a live daemon would otherwise lose its socket.
"""

from __future__ import annotations

import errno
import grp
import ipaddress
import logging
import os
import socket
import stat
from pathlib import Path

from edged.errors import ConfigError

log = logging.getLogger(__name__)

BIND_UMASK = 0o177


def remove_stale(path: Path) -> None:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise ConfigError(f"socket path {path} exists and is not a socket; remove it or choose another path")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except ConnectionRefusedError:
        log.info("removing stale socket %s (nothing is listening on it)", path)
        path.unlink(missing_ok=True)
        return
    except OSError as e:
        if e.errno in (errno.ENOENT,):
            return
        raise ConfigError(f"cannot check existing socket {path}: {e.strerror}") from e
    finally:
        probe.close()
    raise ConfigError(f"another edged is listening on {path}; stop it or choose another socket path")


def group_id(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise ConfigError(f"server.socket_group: unknown group {name!r}") from None


def set_mode_and_group(path: Path, mode: str, group: str | None) -> None:
    """Give a socket file bound under BIND_UMASK its configured octal ``mode`` and ``group``, through a descriptor
    of the file itself (O_PATH, not following a symlink) that is checked to be a socket: in a folder another user
    can write, the file may be swapped for a symlink after the bind, and chmod would follow it."""
    gid = group_id(group) if group else -1
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(f"socket {path} was removed right after edged bound it; is another process using "
                          "that folder? Put the socket in a folder only edged's user can write") from None
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise ConfigError(f"{path} is not the socket edged bound (replaced by a symlink or another file right "
                              "after the bind); put the socket in a folder only edged's user can write")
        opened = f"/proc/self/fd/{fd}"
        if os.path.exists(opened):  # the magic link reaches the file the descriptor holds, never a new symlink
            os.chmod(opened, int(mode, 8))
            if gid != -1:
                os.chown(opened, -1, gid)
        else:  # no /proc: the check above narrows the window to the chmod; chown does not follow a symlink
            os.chmod(path, int(mode, 8))
            if gid != -1:
                os.chown(path, -1, gid, follow_symlinks=False)
    finally:
        os.close(fd)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and ::ffff:127.x.y.z (an IPv6 socket's name for IPv4 loopback); never 0.0.0.0 or ::."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def next_step(error: OSError, path: Path | None = None, key: str = "") -> str:
    """What to do about a failed bind or listen, for the error message: the usual causes each name their fix
    (``path``: a Unix socket's file, else a TCP address; ``key``: the config key and flag that choose it)."""
    other = f" or choose another one ({key})" if key else ""
    if error.errno == errno.EADDRINUSE:
        if path is None:
            return f"; another process listens there (`ss -ltnp` shows which): stop it{other}"
        return f"; another process holds this socket: stop it{other}"
    if error.errno == errno.ENOENT and path is not None:
        return f"; its folder {path.parent} does not exist: create it (mkdir -p {path.parent}){other}"
    if error.errno in (errno.EACCES, errno.EPERM):
        where = f"create files in {path.parent}" if path is not None else "listen on this port"
        return f"; this user may not {where}: run edged as a user who may{other}"
    if error.errno == errno.EADDRNOTAVAIL:
        return f"; no interface of this machine has that address{other}"
    return ""

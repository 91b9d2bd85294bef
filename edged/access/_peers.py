"""Who is on the other end of a Unix socket (SO_PEERCRED) and what that peer may do, for both front ends.

Administrators (load, unload, daemon actions) are root and the daemon's own user always, plus
``[server.access]`` ``admin_users`` / ``admin_groups``. Inference (and shared memory) is open to anyone who
can connect (the socket's mode and group are then the control) unless ``infer_users`` / ``infer_groups`` are
set; then to those and the administrators. Everything else (health, metadata, config, statistics, index,
status) is open.

Group membership is looked up once per uid/gid and kept ``PEER_CACHE_TTL_S`` seconds (device time, which
does not jump with the wall clock): connections cost no user-database lookups, and a user removed from a
group loses access within that time, even on a connection opened before. Names in the lists are resolved
once, when the policy is built; an unknown name is a ConfigError.

The HTTP server and the gRPC server each judge their Unix-socket callers with a `PeerPolicy` (read once per
connection with `peer_of`), so the same user gets the same answer on either socket. TCP callers have no
credentials: see `TcpRestrictions`.
"""

from __future__ import annotations

import grp
import logging
import os
import pwd
import socket
import struct
from dataclasses import dataclass
from typing import Any

from edged.clock import Clock, DeviceClock
from edged.config import AccessConfig
from edged.errors import ConfigError, PermissionDenied

log = logging.getLogger(__name__)

PEER_CACHE_TTL_S = 30.0
_PEER_CACHE_SIZE = 1024  # distinct (uid, gid) pairs; past it the cache starts again rather than growing
_UCRED = struct.Struct("3i")
_WHO = {"admin": "administrators are root, the daemon's user and server.access admin_users / admin_groups",
        "infer": "server.access infer_users / infer_groups limit inference, administrators included"}


@dataclass(frozen=True)
class Peer:
    """Who is on the other end of a connection; uid -1 when unknown (TCP)."""

    pid: int
    uid: int
    gid: int

    def describe(self) -> str:
        """For log lines on the event loop: no user-database lookup (`PeerPolicy.describe` names the user)."""
        if self.uid < 0:
            return "a loopback TCP client (no peer credentials)"
        return f"uid {self.uid} (pid {self.pid})"


UNKNOWN_PEER = Peer(-1, -1, -1)


def peer_of(sock: socket.socket | Any) -> Peer:
    """The credentials of a Unix-socket peer: one getsockopt, no user-database lookup. ``sock`` may be the
    socket asyncio's transports hand out (``get_extra_info("socket")``), which has ``getsockopt`` too."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return Peer(pid, uid, gid)


@dataclass(frozen=True)
class _Identity:
    name: str
    groups: frozenset[int]
    expires: float


class PeerDirectory:
    """uid/gid → user name and groups (primary and supplementary), each looked up once per ``ttl_s``."""

    def __init__(self, clock: Clock, ttl_s: float = PEER_CACHE_TTL_S) -> None:
        self._clock = clock
        self._ttl_s = ttl_s
        self._cache: dict[tuple[int, int], _Identity] = {}

    def identity(self, uid: int, gid: int) -> _Identity:
        now = self._clock.elapsed()
        found = self._cache.get((uid, gid))
        if found is None or found.expires <= now:
            found = _look_up(uid, gid, now + self._ttl_s)
            if len(self._cache) >= _PEER_CACHE_SIZE:
                self._cache.clear()
            self._cache[(uid, gid)] = found
        return found


def _look_up(uid: int, gid: int, expires: float) -> _Identity:
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid without a passwd entry has only its primary group
        return _Identity(str(uid), frozenset({gid}), expires)
    return _Identity(name, frozenset({gid, *os.getgrouplist(name, gid)}), expires)


@dataclass(frozen=True)
class _Allowed:
    uids: frozenset[int]
    gids: frozenset[int]


class PeerPolicy:
    def __init__(self, config: AccessConfig, *, clock: Clock | None = None) -> None:
        self._directory = PeerDirectory(clock if clock is not None else DeviceClock())
        # root and the daemon's own user can change the repository and the config anyway
        self._admin = _Allowed(_uids(config.admin_users) | {0, os.getuid()}, _gids(config.admin_groups))
        infer = _Allowed(_uids(config.infer_users), _gids(config.infer_groups))
        self.infer_open = not infer.uids and not infer.gids
        self._infer = _Allowed(infer.uids | self._admin.uids, infer.gids | self._admin.gids)

    def check(self, peer: Peer, permission: str, action: str) -> None:
        """Raise PermissionDenied unless the Unix-socket ``peer`` may use a call of ``permission``."""
        if permission == "open" or (permission == "infer" and self.infer_open):
            return
        allowed = self._admin if permission == "admin" else self._infer
        if peer.uid in allowed.uids:
            return
        if peer.uid < 0:  # credentials could not be read: nobody to look up
            raise PermissionDenied(f"permission denied: a Unix-socket client with unreadable credentials may "
                                   f"not {action}")
        identity = self._directory.identity(peer.uid, peer.gid)
        if identity.groups & allowed.gids:
            return
        raise PermissionDenied(f"permission denied: {self.describe(peer)} may not {action} ({_WHO[permission]})")

    def groups(self, peer: Peer) -> frozenset[int]:
        """The peer's primary and supplementary groups (from the peer cache), as edged.shm checks a region's
        owner against; empty for a peer without credentials."""
        if peer.uid < 0:
            return frozenset()
        return self._directory.identity(peer.uid, peer.gid).groups

    def describe(self, peer: Peer) -> str:
        """The peer with its user name, from the peer cache."""
        if peer.uid < 0:
            return peer.describe()
        return f"user {self._directory.identity(peer.uid, peer.gid).name} (uid {peer.uid})"


def _uids(names: tuple[str, ...]) -> frozenset[int]:
    uids = set()
    for name in names:
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            raise ConfigError(f"server.access: unknown user {name!r} (no such entry in the user database); "
                              "create the user or remove it from [server.access]") from None
    return frozenset(uids)


def _gids(names: tuple[str, ...]) -> frozenset[int]:
    gids = set()
    for name in names:
        try:
            gids.add(grp.getgrnam(name).gr_gid)
        except KeyError:
            raise ConfigError(f"server.access: unknown group {name!r} (no such entry in the group database); "
                              f"create it (groupadd {name}) or remove it from [server.access]") from None
    return frozenset(gids)

"""Peer-credential access control on the Unix socket (SO_PEERCRED).

Names in ``[server.access]`` are resolved to uids and gids once, when the server is built; an unknown name is
a ConfigError. An empty pair of lists allows everyone who can connect (the socket's mode is then the control).
Administrators may also run inference. Loopback TCP carries no credentials: where a list restricts an action,
TCP callers are refused it.
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import pwd
import socket
import struct
from dataclasses import dataclass

from edged.config import AccessConfig
from edged.errors import ConfigError, PermissionDenied

log = logging.getLogger(__name__)

_UCRED = struct.Struct("3i")


@dataclass(frozen=True)
class Peer:
    """Who is on the other end of a connection; uid -1 when unknown (TCP)."""

    pid: int
    uid: int
    gid: int
    groups: frozenset[int]

    def describe(self) -> str:
        if self.uid < 0:
            return "a loopback TCP client (no peer credentials)"
        try:
            name = pwd.getpwuid(self.uid).pw_name
        except KeyError:
            name = str(self.uid)
        return f"user {name} (uid {self.uid})"


UNKNOWN_PEER = Peer(-1, -1, -1, frozenset())


def peer_of(sock: socket.socket) -> Peer:
    """The credentials of a Unix-socket peer, with its supplementary groups."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    groups = {gid}
    with contextlib.suppress(KeyError):  # a uid without a passwd entry has only its primary group
        groups.update(os.getgrouplist(pwd.getpwuid(uid).pw_name, gid))
    return Peer(pid, uid, gid, frozenset(groups))


@dataclass(frozen=True)
class _Allowed:
    uids: frozenset[int]
    gids: frozenset[int]

    @property
    def anyone(self) -> bool:
        return not self.uids and not self.gids

    def admits(self, peer: Peer) -> bool:
        return self.anyone or peer.uid in self.uids or bool(peer.groups & self.gids)


class AccessPolicy:
    def __init__(self, config: AccessConfig) -> None:
        self._admin = _Allowed(_uids(config.admin_users), _gids(config.admin_groups))
        infer = _Allowed(_uids(config.infer_users), _gids(config.infer_groups))
        # administrators may always infer; with no infer lists everyone may
        self._infer = infer if infer.anyone else _Allowed(infer.uids | self._admin.uids,
                                                          infer.gids | self._admin.gids)

    def check(self, peer: Peer, permission: str, action: str) -> None:
        allowed = self._admin if permission == "admin" else self._infer if permission == "infer" else None
        if allowed is None or allowed.admits(peer):
            return
        raise PermissionDenied(f"permission denied: {peer.describe()} may not {action}")


def _uids(names: tuple[str, ...]) -> frozenset[int]:
    uids = set()
    for name in names:
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            raise ConfigError(f"server.access: unknown user {name!r} (no such entry in the user database)") from None
    return frozenset(uids)


def _gids(names: tuple[str, ...]) -> frozenset[int]:
    gids = set()
    for name in names:
        try:
            gids.add(grp.getgrnam(name).gr_gid)
        except KeyError:
            raise ConfigError(f"server.access: unknown group {name!r} (no such entry in the group database)") \
                from None
    return frozenset(gids)

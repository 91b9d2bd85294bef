"""Who may do what on the HTTP front end: peer credentials (SO_PEERCRED) on the Unix socket, judged by the
`PeerPolicy` both front ends share (`edged.access`), and request headers on loopback TCP (`TcpRestrictions`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from edged.access import PEER_CACHE_TTL_S, UNKNOWN_PEER, Peer, PeerPolicy, TcpRestrictions, peer_of
from edged.clock import Clock
from edged.config import AccessConfig
from edged.errors import PermissionDenied
from edged.shm import TCP_CALLER, Caller

__all__ = ["PEER_CACHE_TTL_S", "UNKNOWN_PEER", "AccessPolicy", "Peer", "ShmCallerOf", "peer_of"]

# (over TCP?, the connection's peer, the request's headers) -> who the request uses shared memory as
ShmCallerOf = Callable[[bool, Peer, Mapping[bytes, bytes]], Caller]


class AccessPolicy(PeerPolicy):
    """The shared peer policy plus what only HTTP needs: its TCP restrictions and the shm caller."""

    def __init__(self, config: AccessConfig, tcp_restricted: Mapping[str, str] | None = None, *,
                 clock: Clock | None = None) -> None:
        super().__init__(config, clock=clock)
        self.tcp = TcpRestrictions(tcp_restricted or {}, self.infer_open)

    def shm_caller(self, tcp: bool, peer: Peer, headers: Mapping[bytes, bytes]) -> Caller:
        """Who a request uses shared memory as (edged.shm checks a region's owner against it), or
        PermissionDenied. On the Unix socket: the peer with its groups (from the peer cache); a peer whose
        credentials could not be read has no identity to check an owner against and is refused. Over TCP: the
        request must carry the ``[server.tcp_restricted]`` shared-memory header, whatever route it is on (an
        infer request naming a region too, though it was admitted as inference)."""
        if tcp:
            self.tcp.check("shared-memory", "admin", headers, "use shared memory")
            return TCP_CALLER
        if peer.uid < 0:
            raise PermissionDenied("permission denied: a Unix-socket client whose credentials could not be read "
                                   "may not use shared memory")
        return Caller(peer.uid, peer.gid, self.groups(peer))

"""Who may do what on the HTTP front end: peer credentials (SO_PEERCRED) on the Unix socket, judged by the
`PeerPolicy` both front ends share (`edged.access`), and request headers on loopback TCP (`TcpRestrictions`).
"""

from __future__ import annotations

from collections.abc import Mapping

from edged.access import PEER_CACHE_TTL_S, UNKNOWN_PEER, Peer, PeerPolicy, TcpRestrictions, peer_of
from edged.clock import Clock
from edged.config import AccessConfig
from edged.shm import TCP_CALLER, Caller

__all__ = ["PEER_CACHE_TTL_S", "UNKNOWN_PEER", "AccessPolicy", "Peer", "peer_of"]


class AccessPolicy(PeerPolicy):
    """The shared peer policy plus what only HTTP needs: its TCP restrictions and the shm caller."""

    def __init__(self, config: AccessConfig, tcp_restricted: Mapping[str, str] | None = None, *,
                 clock: Clock | None = None) -> None:
        super().__init__(config, clock=clock)
        self.tcp = TcpRestrictions(tcp_restricted or {}, self.infer_open)

    def caller(self, peer: Peer) -> Caller:
        """The peer with its groups (from the peer cache), as edged.shm checks a region's owner against."""
        if peer.uid < 0:
            return TCP_CALLER
        return Caller(peer.uid, peer.gid, self.groups(peer))

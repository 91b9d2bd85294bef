"""What the front ends share about callers and their sockets: the peer-credential policy of both Unix sockets
(SO_PEERCRED, ``[server.access]``), Triton's restricted API categories for TCP callers, the sockets systemd
passes (LISTEN_FDS by name), stale-socket checks, socket mode and group, loopback addresses; and the in-flight
body budget both front ends share.
"""

from edged.access._activation import GRPC_NAME, HTTP_NAME, Activated, activated_sockets
from edged.access._budget import BodyBudget
from edged.access._peers import PEER_CACHE_TTL_S, UNKNOWN_PEER, Peer, PeerPolicy, peer_of
from edged.access._restricted import TcpRestrictions
from edged.access._socket_files import BIND_UMASK, group_id, is_loopback, next_step, remove_stale, set_mode_and_group

__all__ = ["BIND_UMASK", "GRPC_NAME", "HTTP_NAME", "PEER_CACHE_TTL_S", "UNKNOWN_PEER", "Activated", "BodyBudget",
           "Peer", "PeerPolicy", "TcpRestrictions", "activated_sockets", "group_id", "is_loopback", "next_step",
           "peer_of", "remove_stale", "set_mode_and_group"]

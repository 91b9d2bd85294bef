"""Access control shared by the front ends that have no peer credentials to judge (loopback TCP, the gRPC
Unix socket), and the socket files they create: Triton's restricted API categories, stale-socket checks,
socket mode and group, loopback addresses; and the in-flight body budget both front ends share.
Peer-credential policy (SO_PEERCRED) stays with the HTTP server.
"""

from edged.access._budget import BodyBudget
from edged.access._restricted import TcpRestrictions
from edged.access._socket_files import BIND_UMASK, group_id, is_loopback, remove_stale, set_mode_and_group

__all__ = ["BIND_UMASK", "BodyBudget", "TcpRestrictions", "group_id", "is_loopback", "remove_stale",
           "set_mode_and_group"]

"""Who may make which gRPC call: the HTTP API's rules, on each listener the HTTP API has its counterpart of.

- On the gRPC Unix socket a call is judged by its caller's credentials (SO_PEERCRED, read once per connection,
  on its first stream) with the `PeerPolicy` the HTTP Unix socket uses (``[server.access]``: administrators
  for RepositoryModelLoad/Unload, ``infer_users`` / ``infer_groups`` where set for inference and shared
  memory, everything else open; groups from the 30 s peer cache), and shared memory is used as that caller:
  registering needs the object's owner or group, and a region registered by one user cannot be read, written,
  listed or unregistered by another (`edged.shm`). A peer whose credentials cannot be read gets only the open
  calls. ``[server.tcp_restricted]`` does not apply there, as on the HTTP Unix socket.
- Over TCP there are no credentials: a call is judged by its category and its metadata (`TcpRestrictions`,
  ``[server.tcp_restricted]`` keys sent as gRPC metadata), and shared memory is used as a TCP caller.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from edged.access import Peer, PeerPolicy, TcpRestrictions
from edged.config import ServerConfig
from edged.errors import PermissionDenied
from edged.shm import TCP_CALLER, Caller

log = logging.getLogger(__name__)


class GrpcAccess:
    def __init__(self, config: ServerConfig) -> None:
        # unknown user or group names and malformed tcp_restricted entries fail here, when the server is built
        self._peers = PeerPolicy(config.access)
        self._tcp = TcpRestrictions(config.tcp_restricted, infer_open=self._peers.infer_open,
                                    listener="gRPC over TCP",
                                    elsewhere="or use edged's gRPC Unix socket (server.grpc_socket)")

    def check(self, peer: Peer | None, category: str, permission: str, metadata: Mapping[bytes, bytes],
              action: str) -> None:
        """Raise PermissionDenied unless the call may be served: ``peer`` is the Unix-socket caller, None
        over TCP."""
        if peer is None:
            self._tcp.check(category, permission, metadata, action)
            return
        if permission == "open" or (permission == "infer" and peer.uid >= 0 and self._peers.infer_open):
            return  # what PeerPolicy.check would find first, without its call: the usual ModelInfer
        if peer.uid < 0 and permission != "open":
            # no identity to check a shared-memory object's owner against: refused rather than let through
            raise PermissionDenied(f"permission denied: a gRPC Unix-socket client whose credentials could not "
                                   f"be read may not {action}")
        self._peers.check(peer, permission, action)

    @property
    def tcp_shm_configured(self) -> bool:
        """Whether ``[server.tcp_restricted]`` has a shared-memory key: without one no TCP call uses shared memory."""
        return self._tcp.configured("shared-memory")

    def tcp_admits_shm(self, metadata: Mapping[bytes, bytes]) -> bool:
        """Whether a TCP call's metadata carry the shared-memory key (a ModelInfer is admitted as inference,
        which says nothing about the regions it names)."""
        return self._tcp.admits("shared-memory", metadata)

    def refuse_tcp_shm(self) -> Caller:
        """The caller of a TCP call without the shared-memory key: it may name no region (PermissionDenied,
        saying which key to send, or that shared memory over TCP is off)."""
        self._tcp.check("shared-memory", "admin", {}, "use shared memory")
        raise AssertionError("TcpRestrictions.check admits no shared-memory call without its key")

    def caller(self, peer: Peer | None) -> Caller:
        """Who a call uses shared memory as: the Unix-socket peer with its groups (peer cache), else TCP's."""
        if peer is None:
            return TCP_CALLER
        return Caller(peer.uid, peer.gid, self._peers.groups(peer))

    def describe(self, peer: Peer | None) -> str:
        return "a gRPC TCP client" if peer is None else self._peers.describe(peer)

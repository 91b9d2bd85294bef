"""Access control where there are no peer credentials (loopback TCP, for HTTP and gRPC): Triton's restricted
API categories. Unix-socket callers of either front end are judged by their credentials instead (`PeerPolicy`).

Any local user can open a loopback port, so over TCP a request is judged by its route's category
(`edged.serving._routes.SPECS`, `edged.grpcapi.server.RPCS`) and its headers (gRPC: metadata keys) only:

- a category with a ``[server.tcp_restricted]`` key is served only to requests carrying that header with
  that value (compared in constant time), as Triton's ``--http-restricted-api`` does;
- without a key, loading and unloading models (the administrators' calls on the Unix socket) and every
  shared-memory call are refused (a TCP caller has no identity to check a region's owner against), and so is
  inference where ``[server.access]`` limits it to listed users; everything else is open, including the
  repository index that tritonclient reads.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from edged.config import check_tcp_restricted, parse_restriction
from edged.errors import PermissionDenied


class TcpRestrictions:
    def __init__(self, table: Mapping[str, str], infer_open: bool, listener: str = "loopback TCP",
                 elsewhere: str = "or use the Unix socket") -> None:
        check_tcp_restricted(dict(table))  # a ServerConfig built in code has not been through the loader
        self._keys: dict[str, tuple[bytes, bytes]] = {}
        for category, text in table.items():
            name, value = parse_restriction(category, text)
            self._keys[category] = (name.encode("ascii"), value.encode("ascii"))
        self.header_names = frozenset(name for name, _ in self._keys.values())
        self._infer_open = infer_open
        self._listener = listener  # how messages name where the request came (e.g. "gRPC")
        self._elsewhere = elsewhere  # where a caller can go instead, or "" when nowhere

    @property
    def _also(self) -> str:
        return f", {self._elsewhere}" if self._elsewhere else ""

    def configured(self, category: str) -> bool:
        return category in self._keys

    def admits(self, category: str, headers: Mapping[bytes, bytes]) -> bool:
        """Whether ``headers`` carry ``category``'s configured key (False when none is configured): `check`'s
        yes without raising, for a front end that picks a path by it on every call."""
        key = self._keys.get(category)
        if key is None:
            return False
        sent = headers.get(key[0])
        return sent is not None and hmac.compare_digest(sent, key[1])

    def check(self, category: str, permission: str, headers: Mapping[bytes, bytes], action: str) -> None:
        """Raise PermissionDenied unless a TCP request of ``category`` with ``headers`` may be served."""
        key = self._keys.get(category)
        if key is not None:
            sent = headers.get(key[0])
            if sent is not None and hmac.compare_digest(sent, key[1]):
                return
            raise PermissionDenied(f"permission denied: the {category} API over {self._listener} requires the "
                                   f"header {key[0].decode()!r} set in server.tcp_restricted.{category}; it "
                                   "was missing or did not match")
        if category == "shared-memory":
            raise PermissionDenied(f"permission denied: shared memory over {self._listener} is off, because it "
                                   "carries no peer identity to check a region's owner against; set "
                                   'server.tcp_restricted.shared-memory = "HEADER=VALUE" and send that header'
                                   f"{self._also}")
        if permission == "admin":
            raise PermissionDenied(f"permission denied: a {self._listener} client may not {action}; set "
                                   f'server.tcp_restricted.{category} = "HEADER=VALUE" and send that header'
                                   f"{self._also}")
        if permission == "infer" and not self._infer_open:
            raise PermissionDenied(f"permission denied: a {self._listener} client may not {action}: server.access "
                                   "limits it to listed users and it carries no credentials; set "
                                   f'server.tcp_restricted.{category} = "HEADER=VALUE" and send that header')

"""`BodyBudget`: bytes of request bodies and messages held at once, one per daemon for both front ends.

``[server] max_inflight_body_bytes`` bounds what the HTTP server and the gRPC server hold together (bodies read but
not yet answered, gRPC messages still arriving), so a flood on one front end cannot take the memory the other needs.
Both front ends take and release it on the daemon's event loop, so it needs no lock.
"""

from __future__ import annotations


class BodyBudget:
    """Bytes of request bodies held by all connections together; taken before reading, released on answer."""

    __slots__ = ("limit", "refused", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.refused = 0

    def take(self, count: int) -> bool:
        if self.used + count > self.limit:
            self.refused += 1
            return False
        self.used += count
        return True

    def release(self, count: int) -> None:
        self.used -= count

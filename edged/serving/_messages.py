"""What a connection hands the dispatcher and gets back: a parsed request and its place in the response order.

An `Incoming` holds only the headers something reads (`WANTED_HEADERS`, plus those access control names); a
`Slot` is filled exactly once, by whichever path answers the request, and written when every slot before it
on its connection has been.
"""

from __future__ import annotations

from collections.abc import Callable

from edged.errors import InvalidInput

# The only request headers anything reads; the others are counted against the size limit and dropped. Most
# headers are dismissed by their length, without lowercasing them.
WANTED_HEADERS = frozenset({b"content-encoding", b"content-length", b"expect", b"inference-header-content-length",
                            b"transfer-encoding"})


class Slot:
    """A place in a connection's response order."""

    __slots__ = ("cancel", "close", "data", "pending", "reserved")

    def __init__(self) -> None:
        self.data: bytes | None = None
        self.close = False
        self.reserved = 0  # bytes of the in-flight body budget this request holds until it is answered
        # A streamed response (SSE): parts written before the slot reached the head of the line (None until the
        # first), and what to call when the client goes away before the last part (it cancels the generation;
        # an infer request's is `unqueued_when_gone`).
        self.pending: list[bytes] | None = None
        self.cancel: Callable[[], None] | None = None


def unqueued_when_gone() -> None:
    """The ``cancel`` of an infer request's slot. Nothing to call: its request shares the connection's
    ``cancellation`` (set when the connection is lost, which drops it unrun if it is still queued); set, it marks
    the slot as worth finding out about after a half-close (see ``edged.serving._responder``)."""


class Incoming(Slot):
    """A complete request as the parser delivered it, and its place in the response order: every request
    takes one, so the two are one object (one allocation and one call per request, not two)."""

    __slots__ = ("body", "headers", "keep_alive", "method", "url")

    def __init__(self, method: bytes, url: bytes, headers: dict[bytes, bytes], body: bytes | bytearray,
                 keep_alive: bool, reserved: int) -> None:
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        # Slot's fields, set here rather than by a second __init__ call
        self.data = None
        self.close = False
        self.reserved = reserved
        self.pending = None
        self.cancel = None


class Reject(Exception):
    """Raised inside a parser callback: the connection answers ``status`` and closes."""

    def __init__(self, status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = (),
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers
        self.code = code  # OpenAI's error code, for a request under /v1


def header_int(headers: dict[bytes, bytes], name: bytes) -> int | None:
    """An integer header's value, None when absent; a malformed value is an InvalidInput."""
    raw = headers.get(name)
    if raw is None:
        return None
    if not raw.strip().isdigit():
        raise InvalidInput(f"header {name.decode()} must be a non-negative integer, found {raw[:40]!r}")
    return int(raw)

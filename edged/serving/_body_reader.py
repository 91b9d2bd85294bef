"""Large request bodies read straight into their buffer, past the HTTP parser.

Guarantees: a body declared by a Content-Length of ``LARGE_BODY_BYTES`` or more is read by the transport
into one buffer (``recv_into`` on a memoryview of what is left of it, grown a step at a time), so the parser and
Python's per-read callbacks run once per read of up to the whole remaining body instead of once per
~5 KiB read (a 6.2 MB camera frame over a Unix socket came in ~1,160 reads, each through the parser and
``on_body``); nothing is joined or copied after the read. The reader asks the transport for exactly the
bytes the body still lacks, so a pipelined request behind it is never read into the body: it is parsed by a
fresh parser once the body is complete. Every limit is applied by the connection before a byte of the body
is read (max_body_bytes, the model's bound, the in-flight budget reserved for the declared length); a client
that stops mid-body is left to the request timeout and a close to ``connection_lost``, both forwarded to the
connection. Chunked bodies (no Content-Length) stay on the parser's path.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edged.serving._http import Connection

# Below this a body arrives in a few reads and the parser's path costs less than switching the protocol twice;
# above uvloop's and asyncio's read size (~250 KiB) a body can never arrive in the read that carried its head.
LARGE_BODY_BYTES = 256 * 1024
GROWTH_STEP = 1024 * 1024  # the most one read can take: the kernel hands a Unix socket's data over in far less


class LargeBody:
    """A declared body's buffer and how much of it has arrived; filled first by the parser, then the reader."""

    __slots__ = ("buffer", "filled", "length")

    def __init__(self, length: int) -> None:
        self.buffer = bytearray()
        self.filled = 0
        self.length = length

    def add(self, data: bytes) -> None:
        """A piece the parser saw in the read that carried the head (at most one read's worth)."""
        self.buffer += data
        self.filled += len(data)

    def room(self) -> memoryview:
        """Where the next read goes. The buffer grows a step at a time, never all at once: a fresh
        bytearray(length) zeroes every page in one loop callback (53 MB: 40 ms of page faults on the build VM)."""
        buffer = self.buffer
        if len(buffer) == self.filled:
            buffer += bytes(min(GROWTH_STEP, self.length - self.filled))  # bytes(n) is calloc'ed: no second pass
        # A new view each read, released once the read is done: a bytearray with a live view cannot grow.
        return memoryview(buffer)[self.filled:]

    @property
    def complete(self) -> bool:
        return self.filled == self.length


class BodyReader(asyncio.BufferedProtocol):
    """The transport's protocol while a large body is read; everything but the body goes to the connection."""

    def __init__(self, connection: Connection, body: LargeBody) -> None:
        self._connection = connection
        self._body = body
        self._loop = asyncio.get_running_loop()
        self.reads = 0  # buffer_updated calls: how many reads the body took after its head's read

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._body.room()

    def buffer_updated(self, nbytes: int) -> None:
        body = self._body
        body.filled += nbytes
        self.reads += 1
        connection = self._connection
        connection.last_activity = self._loop.time()
        if body.complete or connection.closing:
            connection.large_body_read()

    def eof_received(self) -> bool | None:
        return self._connection.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._connection.connection_lost(exc)

    def pause_writing(self) -> None:
        self._connection.pause_writing()

    def resume_writing(self) -> None:
        self._connection.resume_writing()

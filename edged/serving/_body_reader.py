"""Large request bodies read straight into their buffer, past the HTTP parser.

Guarantees: a body declared by a Content-Length of ``LARGE_BODY_BYTES`` or more is read by the transport into
one buffer (``recv_into`` on a memoryview of what is left of it), so the parser and Python's per-read callbacks
run once per read of up to the whole remaining body, not once per ~5 KiB read (a 6.2 MB camera frame over a
Unix socket came in ~1,160 reads, each through the parser and ``on_body``); nothing is joined or copied after
the read. The reader asks the transport for exactly the bytes the body still lacks, so a pipelined request
behind it is never read into the body: a fresh parser reads it once the body is complete. Every limit is
applied by the connection before a byte of the body is read (max_body_bytes, the model's bound, the in-flight
budget reserved for the declared length); a client that stops mid-body meets the request timeout, and its
close reaches ``connection_lost``, both on the connection. Chunked bodies (no Content-Length) stay on the
parser's path.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edged.serving._http import Connection

# Below this a body arrives in a few reads and the parser's path costs less than switching the protocol twice;
# above uvloop's and asyncio's read size (~250 KiB) a body can never arrive in the read that carried its head.
LARGE_BODY_BYTES = 256 * 1024
# glibc serves allocations up to 32 MiB from memory it keeps once it has seen one that size freed (its dynamic
# mmap threshold); larger ones are mapped fresh each time.
PREALLOCATE_BYTES = 16 * 1024 * 1024
GROWTH_STEP = 1024 * 1024  # past PREALLOCATE_BYTES, the most one read can take (a Unix socket hands over far less)


class LargeBody:
    """A declared body's buffer and how much of it has arrived; filled first by the parser, then the reader."""

    __slots__ = ("buffer", "filled", "length")

    def __init__(self, length: int) -> None:
        self.buffer = bytearray()  # allocated when the first byte of the body is there (_allocate)
        self.filled = 0
        self.length = length

    def _allocate(self) -> None:
        # Zeroed at once up to PREALLOCATE_BYTES: malloc hands such a buffer back from memory the last bodies
        # used, so the zeroing is cheap (0.4 ms for 6.2 MB) and the reads fault in no fresh pages. Not at the
        # head: a client that sends a head and waits holds in-flight budget, not memory.
        if not self.buffer and self.length <= PREALLOCATE_BYTES:
            self.buffer = bytearray(self.length)

    def add(self, data: bytes) -> None:
        """A piece the parser saw in the read that carried the head (at most one read's worth)."""
        self._allocate()
        end = self.filled + len(data)
        if len(self.buffer) >= end:
            self.buffer[self.filled:end] = data
        else:
            self.buffer += data
        self.filled = end

    def room(self) -> memoryview:
        """Where the next read goes. Past PREALLOCATE_BYTES the buffer grows a step at a time: malloc maps such a
        buffer fresh for every body, and zeroing it at once faults in every page in one loop callback (53 MB:
        40 ms on the build VM)."""
        if not self.filled:
            self._allocate()  # the transport asks for room once the socket is readable: the body has begun
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

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._body.room()

    def buffer_updated(self, nbytes: int) -> None:
        body = self._body
        body.filled += nbytes
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

"""HTTP/1.1 over the daemon's Unix socket for asyncio: a small pool of keep-alive connections.

Each request takes an idle connection (or opens one), so concurrent requests from one client run on separate
connections; a connection goes back to the pool when its response was read whole and the daemon keeps it open.
Responses are parsed by httptools' ``HttpResponseParser`` (llhttp, the parser the daemon's own server uses):
Content-Length, chunked and read-until-close bodies, keep-alive by version and Connection header, and interim
100 Continue answers to the ``Expect: 100-continue`` that large bodies are sent with. A response llhttp
rejects is a ``ProtocolError`` and its connection is closed, never reused.

As in the sync transport, a request is repeated only when it provably never reached the daemon: an idle
connection the daemon closed is dropped before anything is written to it, and a POST whose connection is lost
after it was written fails with ProtocolError rather than running twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass

import httptools

from edged.client._calls import Call, Reply
from edged.client._discovery import SocketSearch, connect_failure, find_sockets
from edged.client._errors import ClientTimeout, ProtocolError
from edged.client._sync_transport import IDEMPOTENT, stale

MAX_IDLE = 8
EXPECT_CONTINUE_BYTES = 1 << 20
_HEAD_LIMIT = 64 * 1024
_READ_BYTES = 256 * 1024


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def close(self) -> None:
        self.writer.close()


class AsyncTransport:
    def __init__(self, socket_path: str | os.PathLike[str] | None, timeout_s: float | None,
                 environ: Mapping[str, str] | None) -> None:
        self._explicit = socket_path
        self._environ = environ
        self._timeout_s = timeout_s
        self._idle: list[_Connection] = []
        self.socket_path: str | None = None

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        for conn in idle:
            with contextlib.suppress(OSError):  # the daemon may have closed it first; nothing is lost
                await conn.writer.wait_closed()

    async def exchange(self, call: Call) -> Reply:
        try:
            return await asyncio.wait_for(self._exchange(call), self._timeout_s)
        except asyncio.TimeoutError as e:
            raise ClientTimeout(f"{call.what}: no answer from {self.socket_path} within {self._timeout_s} s") from e

    async def _exchange(self, call: Call) -> Reply:
        while self._idle:
            conn = self._idle.pop()
            if conn.reader.at_eof() or conn.writer.is_closing() or stale(conn.writer.get_extra_info("socket")):
                conn.close()  # closed by the daemon while idle; nothing of this request was written to it
                continue
            try:
                return await self._send(conn, call)
            except (ConnectionError, asyncio.IncompleteReadError) as e:
                conn.close()
                if call.method not in IDEMPOTENT:
                    raise ProtocolError(f"{call.what}: {self.socket_path} closed the connection after the request "
                                        f"was sent ({e or type(e).__name__}); not repeated, since it may have "
                                        "run") from e
        conn = await self._open()
        try:
            return await self._send(conn, call)
        except (ConnectionError, asyncio.IncompleteReadError) as e:
            conn.close()
            raise self._search().unreachable(f"{self.socket_path}: {e or type(e).__name__}") from e

    async def _send(self, conn: _Connection, call: Call) -> Reply:
        expect = len(call.body) >= EXPECT_CONTINUE_BYTES
        try:
            reply, keep = await self._write_and_read(conn, call, expect)
        except BaseException:
            conn.close()
            raise
        if keep and len(self._idle) < MAX_IDLE:
            self._idle.append(conn)
        else:
            conn.close()
        return reply

    async def _write_and_read(self, conn: _Connection, call: Call, expect: bool) -> tuple[Reply, bool]:
        head = _request_head(call, expect)
        if expect:
            # A large body waits for "100 Continue": a daemon that refuses it (413) answers before reading it,
            # and its answer would be lost if the body were written into a connection it has closed.
            conn.writer.write(head)
            await conn.writer.drain()
            interim = await _read_reply(conn.reader, call)
            if interim[0].status != 100:
                return interim
            conn.writer.write(call.body)
        else:
            conn.writer.write(head + call.body)
        await conn.writer.drain()
        return await _read_reply(conn.reader, call)

    def _search(self) -> SocketSearch:
        return find_sockets(self._explicit, self._environ)

    async def _open(self) -> _Connection:
        search = self._search()
        paths = search.existing if self._explicit is None else search.candidates
        reasons: list[str] = []
        for path in paths:
            try:
                reader, writer = await asyncio.open_unix_connection(path, limit=_HEAD_LIMIT)
            except OSError as e:
                reasons.append(connect_failure(path, e))
                continue
            self.socket_path = path
            return _Connection(reader, writer)
        raise search.unreachable("; ".join(reasons) or "none of these exists")


def _request_head(call: Call, expect_continue: bool) -> bytes:
    lines = [f"{call.method} {call.path} HTTP/1.1", "Host: localhost"]
    lines.extend(f"{name}: {value}" for name, value in call.headers)
    if call.method != "GET" or call.body:
        lines.append(f"Content-Length: {len(call.body)}")
    if expect_continue:
        lines.append("Expect: 100-continue")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class _Response:
    """httptools' callbacks for one response; a second message on the same bytes is noted, not parsed into it."""

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.head_done = False
        self.complete = False
        self.trailing = False
        self.keep_alive = False
        self.parser: httptools.HttpResponseParser | None = None
        self._messages = 0

    def on_message_begin(self) -> None:
        self._messages += 1
        self.trailing = self._messages > 1

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.trailing:
            self.headers[name.decode("latin-1").lower()] = value.decode("latin-1").strip()

    def on_headers_complete(self) -> None:
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        if not self.trailing:
            self.chunks.append(body)

    def on_message_complete(self) -> None:
        # llhttp forgets the message's keep-alive once the callback returns: read it here
        if self.parser is not None and not self.trailing:
            self.keep_alive = self.parser.should_keep_alive()
        self.complete = True


async def _read_reply(reader: asyncio.StreamReader, call: Call) -> tuple[Reply, bool]:
    """(the reply, whether the connection may be reused)."""
    response = _Response()
    parser = response.parser = httptools.HttpResponseParser(response)
    head_bytes = 0
    while not response.complete:
        data = await reader.read(_READ_BYTES)
        if not data:
            return _at_eof(response, parser, call)
        if not response.head_done:
            head_bytes += len(data)
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as e:
            raise ProtocolError(f"{call.what}: malformed HTTP response: {e}") from e
        if not response.head_done and head_bytes > _HEAD_LIMIT:
            raise ProtocolError(f"{call.what}: response headers longer than {_HEAD_LIMIT} bytes")
    reply = Reply(parser.get_status_code(), response.headers, b"".join(response.chunks))
    # An interim 1xx is followed by the final answer on this connection; bytes after a final answer that was
    # not asked for mean the stream is out of step: never reuse it.
    keep = 100 <= reply.status < 200 or (response.keep_alive and not response.trailing)
    return reply, keep


def _at_eof(response: _Response, parser: httptools.HttpResponseParser, call: Call) -> tuple[Reply, bool]:
    """The daemon closed the connection: a body delimited by the close is whole, anything else is cut off."""
    framed = "content-length" in response.headers or "chunked" in response.headers.get("transfer-encoding", "")
    if response.head_done and not framed:
        return Reply(parser.get_status_code(), response.headers, b"".join(response.chunks)), False
    # the same error the pool retries on: an idle connection the daemon closed before this request
    raise asyncio.IncompleteReadError(b"".join(response.chunks), None)

"""HTTP/1.1 over the daemon's Unix socket for asyncio: a small pool of keep-alive connections.

Each request takes an idle connection (or opens one), so concurrent requests from one client run on separate
connections; a connection goes back to the pool when its response was read whole and the daemon keeps it open.
The reader handles Content-Length and chunked bodies, which is all the daemon sends, and interim 100 Continue
answers to the ``Expect: 100-continue`` that large bodies are sent with.

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

from edged.client._calls import Call, Reply
from edged.client._discovery import SocketSearch, find_sockets
from edged.client._errors import ClientTimeout, ProtocolError
from edged.client._sync_transport import IDEMPOTENT, stale

MAX_IDLE = 8
EXPECT_CONTINUE_BYTES = 1 << 20
_HEAD_LIMIT = 64 * 1024


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
                reasons.append(f"{path}: {e.strerror or e}")
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


async def _read_reply(reader: asyncio.StreamReader, call: Call) -> tuple[Reply, bool]:
    """(the reply, whether the connection may be reused)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError as e:
        raise ProtocolError(f"{call.what}: response headers longer than {_HEAD_LIMIT} bytes") from e
    status, version, headers = _parse_head(head, call)
    if 100 <= status < 200:
        return Reply(status, headers, b""), True  # interim: the final answer follows
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = await _read_chunked(reader, call)
    elif "content-length" in headers:
        body = await reader.readexactly(_content_length(headers["content-length"], call))
    else:
        return Reply(status, headers, await reader.read()), False
    connection = headers.get("connection", "").lower()
    keep = connection != "close" and (version == "HTTP/1.1" or connection == "keep-alive")
    return Reply(status, headers, body), keep


def _parse_head(head: bytes, call: Call) -> tuple[int, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ProtocolError(f"{call.what}: bad HTTP status line {lines[0]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, sep, value = line.partition(":")
            if not sep:
                raise ProtocolError(f"{call.what}: bad HTTP header line {line!r}")
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), parts[0], headers


def _content_length(value: str, call: Call) -> int:
    if not value.isdigit():
        raise ProtocolError(f"{call.what}: bad Content-Length {value!r}")
    return int(value)


async def _read_chunked(reader: asyncio.StreamReader, call: Call) -> bytes:
    chunks: list[bytes] = []
    while True:
        size_line = (await reader.readuntil(b"\r\n")).split(b";")[0].strip()
        try:
            size = int(size_line, 16)
        except ValueError:
            raise ProtocolError(f"{call.what}: bad chunk size {size_line!r}") from None
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass  # trailers carry nothing the client uses
            return b"".join(chunks)
        chunks.append(await reader.readexactly(size))
        await reader.readexactly(2)

"""Blocking HTTP/1.1 over the daemon's Unix socket: one keep-alive ``http.client`` connection.

A request is repeated only when it provably never reached the daemon: a kept-alive connection is checked before
each request (a non-blocking peek sees the daemon's close), and a stale one is replaced before any byte is
written. Once bytes are written, a lost connection repeats only an idempotent GET; a POST (an inference may
already have run) fails with ProtocolError instead. Failing to connect is ServerUnreachable naming the socket.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import select
import socket
from collections.abc import Mapping

from edged.client._calls import Call, Reply
from edged.client._discovery import SocketSearch, connect_failure, find_sockets
from edged.client._errors import ClientTimeout, ProtocolError

_DISCONNECTED = (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine,
                 http.client.ResponseNotReady)
IDEMPOTENT = frozenset({"GET", "HEAD"})  # the daemon's GET routes change nothing


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over AF_UNIX; the host name only fills the Host header."""

    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.unix_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def stale(sock: socket.socket | None) -> bool:
    """Whether a kept-alive connection is unusable before anything is written to it: the daemon closed it (the
    socket reads end-of-file) or sent bytes nobody asked for. Between requests a usable one has nothing to read."""
    if sock is None:
        return True
    poller = select.poll()  # not select(): it fails for descriptors above 1023
    try:
        poller.register(sock, select.POLLIN)
        events = poller.poll(0)
    except (OSError, ValueError):  # ValueError: the socket was closed under us
        return True
    return bool(events)


class SyncTransport:
    def __init__(self, socket_path: str | os.PathLike[str] | None, timeout_s: float | None,
                 environ: Mapping[str, str] | None) -> None:
        self._explicit = socket_path
        self._environ = environ
        self._timeout_s = timeout_s
        self._conn: UnixHTTPConnection | None = None
        self.socket_path: str | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def exchange(self, call: Call) -> Reply:
        reused = self._conn is not None and not stale(self._conn.sock)
        if self._conn is not None and not reused:
            self.close()  # the daemon closed it while idle: nothing of this request was written to it
        try:
            return self._send(call)
        except _DISCONNECTED as e:
            self.close()
            if not reused:
                raise self._search().unreachable(f"{self.socket_path}: {e or type(e).__name__}") from e
            if call.method not in IDEMPOTENT:
                raise ProtocolError(f"{call.what}: {self.socket_path} closed the connection after the request was "
                                    f"sent ({e or type(e).__name__}); not repeated, since it may have run") from e
        try:
            return self._send(call)
        except _DISCONNECTED as e:
            self.close()
            raise self._search().unreachable(f"{self.socket_path}: {e or type(e).__name__}") from e

    def _send(self, call: Call) -> Reply:
        conn = self._connection()
        headers = dict(call.headers)
        try:
            # A daemon that refuses a large body (413) answers and closes before reading it all; the write
            # then fails, but its answer is still in our receive buffer.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                conn.request(call.method, call.path, body=call.body if call.method != "GET" else None,
                             headers=headers)
            response = conn.getresponse()
            body = response.read()
        except TimeoutError as e:
            self.close()
            raise ClientTimeout(f"{call.what}: no answer from {self.socket_path} within {self._timeout_s} s") from e
        except _DISCONNECTED:
            raise
        except (http.client.HTTPException, OSError) as e:
            self.close()
            raise ProtocolError(f"{call.what}: bad answer from {self.socket_path}: {e!r}") from e
        if response.will_close:
            self.close()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, body)

    def _search(self) -> SocketSearch:
        return find_sockets(self._explicit, self._environ)

    def _connection(self) -> UnixHTTPConnection:
        if self._conn is not None:
            return self._conn
        search = self._search()
        paths = search.existing if self._explicit is None else search.candidates
        reasons: list[str] = []
        for path in paths:
            conn = UnixHTTPConnection(path, self._timeout_s)
            try:
                conn.connect()
            except OSError as e:
                reasons.append(connect_failure(path, e))
                continue
            self._conn, self.socket_path = conn, path
            return conn
        raise search.unreachable("; ".join(reasons) or "none of these exists")

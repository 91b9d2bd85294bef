"""A request head seen before on the same connection, answered without parsing it again.

perf_analyzer and Triton's clients send byte-identical request heads (request line and headers, Content-Length
included, since the body size repeats), and running httptools' callbacks over one costs a good part of a small
request (docs/benchmarks.md). A connection keeps the last head that httptools parsed into one ordinary request
(`learn`), with what the connection derived from it; a later read that is exactly those bytes followed by
exactly the declared body is the same request with another body, and skips the parser.

Why that is safe: every decision taken from a head (its size and version limits, the headers kept, the body's
length and framing, keep-alive) is a function of its bytes alone, and the peer, the other input of the access
decision, is fixed per connection; the access check itself, the draining check and the body budget still run
per request. A head is learned only when the bytes provably framed one message: the read began with the
request line, held one message and nothing else, its head ends at its first blank line, every line ends in
CRLF, the body has the declared length (no chunked framing) and is the rest of the read verbatim. Anything
else, another byte anywhere in the head, a partial read, a second pipelined request in the same read, goes
through httptools as before.
"""

from __future__ import annotations

from typing import NamedTuple

_END = b"\r\n\r\n"


class Repeat(NamedTuple):
    head: bytes
    head_length: int
    total: int  # head and body: a read of exactly this length may be a repeat
    length: int  # the declared body length
    method: bytes
    url: bytes
    headers: dict[bytes, bytes]  # shared by the requests replayed from this head; nothing writes to them


def learn(data: bytes, method: bytes, url: bytes, headers: dict[bytes, bytes], body: bytes | bytearray,
          keep_alive: bool) -> Repeat | None:
    """The head of ``data``, which httptools parsed as exactly one request with ``body``, if it can be
    replayed; None when the read's bytes do not frame that request alone."""
    if not keep_alive or b"expect" in headers or b"content-encoding" in headers:  # a coded body is decoded
        return None  # on its head's word (on_headers_complete), which a replay skips
    declared = headers.get(b"content-length")
    if declared is None or not declared.isdigit() or int(declared) != len(body):
        return None
    end = data.find(_END)
    if end < 0 or data[:1] in (b"\r", b"\n"):  # leading empty lines: the message did not start the read
        return None
    head_length = end + len(_END)
    head = data[:head_length]
    if head_length + len(body) != len(data) or data[head_length:] != body:
        return None
    if head.count(b"\n") != head.count(b"\r\n"):  # a bare LF: the blank line might not be where we looked
        return None
    return Repeat(head, head_length, len(data), len(body), method, url, headers)  # keep-alive, as learned

"""Compressed request bodies: ``Content-Encoding: gzip`` or ``deflate``, as Triton's clients send them
(tritonclient.http's ``request_compression_algorithm``), decoded before anything reads the body.

Guarantees: a coding is known from the head, before a byte of the body is read: ``identity`` is no coding,
``gzip`` (also ``x-gzip``) and ``deflate`` (the zlib format, as tritonclient and RFC 9110 mean it; a raw deflate
stream, as some clients send it, is read as well) are decoded, anything else is a 415 naming it, with the codings
we read in ``accept-encoding``. Decoding never produces more than ``max_body_bytes`` (a zip bomb stops there with a
413 naming the limit), and a stream that is corrupt, cut short or followed by other bytes is a 400 naming
Content-Encoding. The decoded body then meets every other limit (the in-flight budget, the model's bound, the
element limit) as an uncoded one does. Response bodies are never compressed: ``Accept-Encoding`` is ignored,
which HTTP allows (an identity response is always acceptable unless the client refuses it explicitly).
"""

from __future__ import annotations

import zlib

from edged.serving._messages import Reject

ACCEPTED = ((b"accept-encoding", b"gzip, deflate"),)  # RFC 9110 15.5.16: what a 415 for a coding names
_WBITS = {b"gzip": 16 + zlib.MAX_WBITS, b"x-gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}


def content_coding(header: bytes) -> int | None:
    """The zlib window bits that decode a Content-Encoding header's coding; None for identity (no coding)."""
    coding = header.strip().lower()
    if coding in (b"", b"identity"):
        return None
    wbits = _WBITS.get(coding)
    if wbits is None:
        shown = coding[:40].decode("latin-1")
        raise Reject(415, f"Content-Encoding {shown!r} is not supported: send the body uncompressed or "
                          "compressed with gzip or deflate", ACCEPTED)
    return wbits


def check_transfer_coding(header: bytes) -> None:
    """Only chunked framing is read; httptools accepts a coding before it ("gzip, chunked") and would hand on
    the body still coded. RFC 9112 6.1: a transfer coding the server does not understand is a 501."""
    if header.strip().lower() != b"chunked":
        shown = header[:60].decode("latin-1")
        raise Reject(501, f"Transfer-Encoding {shown!r} is not supported: only chunked is; send a compressed body "
                          "with Content-Encoding: gzip or deflate instead")


def decode_body(body: bytes | bytearray, wbits: int, limit: int) -> bytearray:
    """The body a coded request body stands for, at most ``limit`` bytes, or a Reject naming what is wrong."""
    name = "gzip" if wbits > zlib.MAX_WBITS else "deflate"
    decoded = bytearray()
    rest: bytes | bytearray | memoryview = body
    while rest:
        decoder = zlib.decompressobj(wbits)
        try:
            decoded += decoder.decompress(rest, limit + 1 - len(decoded))  # stops one byte past the limit
        except zlib.error as e:
            if wbits == zlib.MAX_WBITS and not decoded:
                wbits = -zlib.MAX_WBITS  # no zlib header: a raw deflate stream
                continue
            raise Reject(400, f"request body is not valid Content-Encoding {name} data ({e})") from None
        if len(decoded) > limit:
            raise Reject(413, f"request body with Content-Encoding {name} decodes to more than the limit of "
                              f"{limit} bytes (server.max_body_bytes)")
        if not decoder.eof:
            raise Reject(400, f"request body with Content-Encoding {name} ends inside its compressed stream")
        rest = decoder.unused_data
        if rest and name != "gzip":
            raise Reject(400, f"request body with Content-Encoding {name} has {len(rest)} bytes after the end of "
                              "its compressed stream")
        # gzip: a body may be several members, one after the other (RFC 1952), decoded as one
    return decoded

"""Infer responses whose layout was seen before reuse their HTTP head and JSON header.

A client that repeats its request gets the same response layout every time: the same model and version, the
same output names, datatypes and shapes, all as binary data, so the status line, the headers (Content-Length
included: the tensor sizes follow from dtype and shape) and the JSON header before the tensor bytes are
byte-identical from one response to the next; only the tensor bytes differ. Building them (a dict per output,
orjson, the formatting of the head) was a good part of answering a small request (docs/benchmarks.md).

Guarantees: a cached response equals what `encode_response` and the head formatting produce for it, because the
cache is keyed by everything they read: model, version, keep-alive, and per output its name, dtype, shape and
binary flag. Only responses whose header depends on nothing else are kept: no request id, no parameters, no
output placed in shared memory, every output binary, every dtype numeric and little-endian (its datatype name
and byte size follow from the dtype). The cache is bounded and emptied when full, so varying layouts cost what
they cost without it and cannot grow memory.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from edged.engine import InferResponse
from edged.protocol import encode_response
from edged.protocol.header_cache import RequestHeader

MAX_ENTRIES = 64

_JSON_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n"
_BINARY_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: %d\r\n"
                b"inference-header-content-length: %d\r\n%s\r\n")
_CLOSE = b"connection: close\r\n"
_NATIVE = frozenset("<|=") if sys.byteorder == "little" else frozenset("<|")
_NUMERIC = frozenset("biuf")


class ResponseHeads:
    def __init__(self) -> None:
        self._heads: dict[tuple[Any, ...], bytes] = {}

    def __len__(self) -> int:
        return len(self._heads)

    def encode(self, result: InferResponse, decoded: RequestHeader, keep_alive: bool,
               placed: frozenset[str]) -> bytes:
        """The whole HTTP response (head and body) for ``result``."""
        key: list[Any] | None = None
        if not (result.id or result.parameters or placed):
            binary_outputs, binary_default = decoded.binary_outputs, decoded.binary_default
            key = [result.model, result.version, keep_alive]
            raws: list[Any] = []
            for name, array in result.outputs.items():
                dtype = array.dtype
                if (not binary_outputs.get(name, binary_default) or dtype.kind not in _NUMERIC
                        or dtype.byteorder not in _NATIVE or not isinstance(array, np.ndarray)):
                    key = None
                    break
                key += (name, dtype, array.shape)
                raws.append(array)
            if key is not None:
                head = self._heads.get(tuple(key))
                if head is not None:
                    raws.insert(0, head)
                    try:  # join reads a C-contiguous array's buffer in place: no tobytes copy per output
                        return b"".join(raws)
                    except TypeError:  # an array that is not C-contiguous exports no plain buffer
                        return b"".join([head, *(array.tobytes() for array in raws[1:])])  # row-major
        body, header_length = encode_response(result, decoded.binary_outputs, decoded.binary_default,
                                              placed=placed)
        tail = b"" if keep_alive else _CLOSE
        if header_length is None:
            return _JSON_HEAD % (len(body), tail) + body
        head = _BINARY_HEAD % (len(body), header_length, tail)
        if key is not None:
            if len(self._heads) >= MAX_ENTRIES:
                self._heads.clear()
            self._heads[tuple(key)] = head + body[:header_length]
        return head + body

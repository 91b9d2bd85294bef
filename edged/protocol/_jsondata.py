"""Large JSON infer bodies without the Python float per element.

``orjson.loads`` of a body turns every element of a ``data`` array into a Python float in a list (32 bytes
per element against 4 for FP32: the measured +410 MB for a 60 MB body) and holds the GIL for the whole
parse. Instead, ``split_data`` finds the flat numeric ``data`` arrays by scanning the body's strings, cuts
them out (the header that remains is small and parsed by orjson as usual), and ``parse_pieces`` parses
each array into its numpy array a piece of ``PIECE_BYTES`` at a time: only one piece's Python floats exist
at once, and other threads (the event loop) run between pieces. Arrays that are nested, hold strings or are
small stay in the header.
A placeholder that does not match the arrays cut out makes the caller parse the whole body the usual way.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from edged.errors import InvalidInput
from edged.protocol._nonfinite import loads

Array = np.ndarray[Any, Any]

SPLIT_MIN_BYTES = 256 * 1024  # smaller bodies are parsed whole: orjson is fastest there
PIECE_BYTES = 256 * 1024  # a few milliseconds of parsing: the longest the GIL is held at a time
_MIN_ARRAY_BYTES = 4096  # arrays shorter than this stay in the header
PLACEHOLDER = "\x00edged-data:"
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_DATA_VALUE = re.compile(rb"\s*:\s*\[")


def split_data(body: bytes | bytearray) -> tuple[bytes, dict[str, memoryview]] | None:
    """(the body with large flat ``data`` arrays replaced by placeholder strings, the arrays' text by
    placeholder); None when there is nothing to cut out or the body is not well-formed enough to scan."""
    pieces: list[bytes | bytearray] = []
    arrays: dict[str, memoryview] = {}
    view = memoryview(body)
    pos = done = 0
    while True:
        quote = body.find(b'"', pos)
        if quote < 0:
            break
        string = _STRING.match(body, quote)
        if string is None:
            return None  # an unterminated string: orjson will say so
        pos = string.end()
        if string.group() != b'"data"':
            continue
        value = _DATA_VALUE.match(body, pos)
        if value is None:
            continue
        start = value.end()
        end = body.find(b"]", start)
        if end < 0 or end - start < _MIN_ARRAY_BYTES or body.find(b"[", start, end) >= 0 \
                or body.find(b'"', start, end) >= 0:
            continue  # nested, holding strings, or small: orjson parses it with the header
        key = f"{PLACEHOLDER}{len(arrays)}"
        pieces += [body[done:start - 1], b'"\\u0000edged-data:%d"' % len(arrays)]
        arrays[key] = view[start:end]
        done = pos = end + 1
    if not arrays:
        return None
    pieces.append(body[done:])
    return b"".join(pieces), arrays


def parse_pieces(name: str, text: memoryview, dtype: np.dtype[Any], count: int,
                 convert: Callable[[list[Any], int, bool], Array]) -> Array:
    """The ``count`` comma-separated JSON values of ``text`` as a flat array of ``dtype``.

    Each piece of about ``PIECE_BYTES`` is parsed by orjson and converted by ``convert`` (the checks of the
    whole-body path: JSON types, ranges) before the next one, with its first value's index and whether the
    piece may hold true/false (a ``t`` or ``f`` in its text, which no number has): only one piece's Python
    objects exist at a time.
    """
    out = np.empty(count, dtype=dtype)
    filled = 0
    pos = 0
    size = len(text)
    while pos < size:
        end = size if size - pos <= PIECE_BYTES else _piece_end(name, text, pos)
        piece = text[pos:end].tobytes()
        try:
            values = loads(b"[" + piece + b"]")
        except orjson.JSONDecodeError as e:
            raise InvalidInput(f"input {name!r}: \"data\" is not a list of numbers: {e}") from None
        pos = end + 1
        if filled + len(values) > count:
            raise InvalidInput(f"input {name!r}: more values in \"data\" than its shape's {count} elements")
        out[filled:filled + len(values)] = convert(values, filled, b"t" in piece or b"f" in piece)
        filled += len(values)
    if filled != count:
        raise InvalidInput(f"input {name!r}: {filled} values for its shape's {count} elements")
    return out


def _piece_end(name: str, text: memoryview, pos: int) -> int:
    raw = text[pos + PIECE_BYTES:pos + PIECE_BYTES + 64].tobytes()
    comma = raw.find(b",")
    if comma < 0:
        raise InvalidInput(f"input {name!r}: a value in \"data\" is longer than 64 characters")
    return pos + PIECE_BYTES + comma


class Unmatched(Exception):
    """The placeholders in the parsed header do not match the arrays cut out: parse the body whole."""


class CutArrays:
    """The arrays ``split_data`` cut out, each to be claimed once by the input whose ``data`` names it."""

    def __init__(self, arrays: dict[str, memoryview]) -> None:
        self._arrays = arrays
        self._claimed: set[str] = set()

    def claim(self, data: Any) -> memoryview | None:
        if type(data) is not str or data not in self._arrays:
            return None
        if data in self._claimed:
            raise Unmatched(data)
        self._claimed.add(data)
        return self._arrays[data]

    def check_all_claimed(self) -> None:
        if len(self._claimed) != len(self._arrays):
            raise Unmatched("an array cut out is not the data of an input")

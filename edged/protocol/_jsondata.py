"""Large JSON infer bodies without the Python float per element.

``orjson.loads`` of a body turns every element of a ``data`` array into a Python float in a list (32 bytes
per element against 4 for FP32: the measured +410 MB for a 60 MB body) and holds the GIL for the whole
parse. Instead, ``split_data`` finds the flat numeric ``data`` arrays by scanning the body's strings, cuts
them out (the header that remains is small and parsed by orjson as usual), and ``parse_floats`` parses
each array straight into its numpy array, a piece of ``PIECE_BYTES`` at a time so that other threads (the
event loop) run between pieces. Arrays that are nested, hold strings or are small stay in the header.
A placeholder that does not match the arrays cut out makes the caller parse the whole body the usual way.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import orjson

from edged.errors import InvalidInput

Array = np.ndarray[Any, Any]

SPLIT_MIN_BYTES = 256 * 1024  # smaller bodies are parsed whole: orjson is fastest there
PIECE_BYTES = 1024 * 1024
_MIN_ARRAY_BYTES = 4096  # arrays shorter than this stay in the header
PLACEHOLDER = "\x00edged-data:"
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_DATA_VALUE = re.compile(rb"\s*:\s*\[")
_NUMBER_BYTES = b"0123456789.eE+-, \t\r\n"
_FLOAT_KINDS = frozenset("f")


def split_data(body: bytes) -> tuple[bytes, dict[str, memoryview]] | None:
    """(the body with large flat ``data`` arrays replaced by placeholder strings, the arrays' text by
    placeholder); None when there is nothing to cut out or the body is not well-formed enough to scan."""
    pieces: list[bytes] = []
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


def parse_floats(name: str, text: memoryview, dtype: np.dtype[Any], count: int) -> Array:
    """The ``count`` comma-separated numbers of ``text`` as a flat array of float ``dtype``."""
    out = np.empty(count, dtype=dtype)
    filled = 0
    pos = 0
    size = len(text)
    while pos < size:
        end = size if size - pos <= PIECE_BYTES else _piece_end(text, pos)
        piece = bytes(text[pos:end])
        pos = end + 1
        values = _parse_piece(name, piece, dtype, count - filled)
        out[filled:filled + values.size] = values
        filled += values.size
    if filled != count:
        raise InvalidInput(f"input {name!r}: {filled} values for its shape's {count} elements")
    if not np.isfinite(out).all():  # no literal can be inf or NaN here: an infinity is an overflow
        raise InvalidInput(f"input {name!r}: a value does not fit in {dtype.name}")
    return out


def _piece_end(text: memoryview, pos: int) -> int:
    raw = text[pos + PIECE_BYTES:pos + PIECE_BYTES + 64].tobytes()
    comma = raw.find(b",")
    if comma < 0:
        raise InvalidInput("a number in \"data\" is longer than 64 characters")
    return pos + PIECE_BYTES + comma


def _parse_piece(name: str, piece: bytes, dtype: np.dtype[Any], room: int) -> Array:
    if piece.translate(None, _NUMBER_BYTES) or not piece.strip():
        raise InvalidInput(f"input {name!r}: \"data\" holds something other than comma-separated numbers")
    expected = piece.count(b",") + 1
    if expected > room:
        raise InvalidInput(f"input {name!r}: more values than its shape's elements")
    try:
        values: Array = np.fromstring(piece, dtype=dtype, sep=",")  # text mode, not the deprecated binary one
    except ValueError:  # numpy >= 2.x on unparsable text; older versions warn and return the values before it
        values = np.empty(0, dtype)
    if values.size != expected:
        raise InvalidInput(f"input {name!r}: \"data\" is not a list of numbers (malformed near value "
                           f"{values.size + 1} of a piece)")
    return values


def is_float(dtype: np.dtype[Any]) -> bool:
    return dtype.kind in _FLOAT_KINDS


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


def as_list(text: memoryview) -> Any:
    """An array cut out, parsed as JSON (for the datatypes ``parse_floats`` does not read)."""
    try:
        return orjson.loads(b"[" + text.tobytes() + b"]")
    except orjson.JSONDecodeError as e:
        raise InvalidInput(f"request body is not valid JSON: {e}") from None

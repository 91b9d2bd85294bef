"""JSON ``data`` values into a tensor of the input's datatype, with Triton's JSON typing.

Triton's HTTP reader takes each element as the JSON type of its datatype and refuses any other: integers
(``1``, never ``1.0`` or ``1e3``) for the INT/UINT types, numbers (integers included, never ``true``) for the
FP types, ``true``/``false`` for BOOL, strings for BYTES. The common case is converted by numpy in one call;
an element of the wrong type or outside the datatype's range is then found one by one, only to name it: the
error gives the input, its datatype, the element's flat (row-major) index and its JSON text.
Integers beyond int64 (UINT64's upper half) make numpy fall back to float64 for the whole list, so a list of
integers that numpy did not keep as integers is converted element by element, exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import orjson

from edged.errors import InvalidInput

Array = np.ndarray[Any, Any]

_PIECE = 64 * 1024  # BYTES elements stored into their array this many at a time
_EXPECTED = {"b": "JSON true/false", "i": "JSON integers", "u": "JSON integers", "f": "JSON numbers",
             "O": "JSON strings"}


def bytes_from_json(name: str, datatype: str, values: Sequence[Any]) -> Array:
    """BYTES elements (the flat values) as an object array of bytes; a non-string element is refused."""
    flat = np.empty(len(values), dtype=object)
    if set(map(type, values)) - {str}:  # a C loop: Python runs per element only to name the wrong one
        index, value = _first(values, lambda v: type(v) is not str)
        raise _wrong_type(name, datatype, "O", index, value)
    encoded = list(map(str.encode, values))
    for start in range(0, len(encoded), _PIECE):  # in pieces: one long C call would hold the GIL all along
        flat[start:start + _PIECE] = encoded[start:start + _PIECE]
    return flat


def numbers_from_json(name: str, datatype: str, dtype: np.dtype[Any], array: Array,
                      values: Callable[[], Sequence[Any]], booleans: bool | None = None,
                      first_index: int = 0) -> Array:
    """``array`` (numpy's reading of the data) as ``dtype``. ``values`` gives the flat JSON values, asked for
    only to check or name elements; ``booleans`` says whether the data may hold true/false (which numpy turns
    into 1/0 silently among numbers), None when unknown: the values are then scanned for them. ``first_index``
    is the flat index of the first value, for data converted a piece at a time."""
    kind = dtype.kind
    if array.size == 0:
        return np.empty(array.shape, dtype=dtype)
    if kind == "b":
        if array.dtype.kind != "b":
            index, value = _first(values(), lambda v: type(v) is not bool)
            raise _wrong_type(name, datatype, kind, first_index + index, value)
        return array.astype(dtype)
    if booleans is None and array.dtype.kind in "iuf":
        booleans = any(type(v) is bool for v in values())
    if array.dtype.kind not in "iuf" or (kind in "iu" and array.dtype.kind == "f") or booleans:
        return _checked(name, datatype, dtype, values(), first_index)
    if kind == "f":
        return _floats(name, datatype, dtype, array)
    info = np.iinfo(dtype)
    lowest, highest = array.min(initial=0), array.max(initial=0)
    if lowest < info.min or highest > info.max:
        return _checked(name, datatype, dtype, values(), first_index)  # names the element out of range
    converted: Array = array.astype(dtype)
    return converted


def _checked(name: str, datatype: str, dtype: np.dtype[Any], values: Sequence[Any], first_index: int) -> Array:
    """The values one by one: each of the JSON type of ``dtype`` and within its range."""
    kind = dtype.kind
    if kind in "iu":
        index, value = _first(values, lambda v: type(v) is not int)
        if index >= 0:
            raise _wrong_type(name, datatype, kind, first_index + index, value)
        info = np.iinfo(dtype)
        index, value = _first(values, lambda v: not info.min <= v <= info.max)
        if index >= 0:
            raise InvalidInput(f"input {name!r} ({datatype}): \"data\" element {first_index + index} is {value}, "
                               f"outside {datatype}'s range {info.min}..{info.max}")
        return np.array(values, dtype=dtype)
    index, value = _first(values, lambda v: type(v) not in (int, float))
    if index >= 0:
        raise _wrong_type(name, datatype, kind, first_index + index, value)
    return _floats(name, datatype, dtype, np.array(values, dtype=np.float64))


def _floats(name: str, datatype: str, dtype: np.dtype[Any], array: Array) -> Array:
    try:
        with np.errstate(over="raise", invalid="raise"):
            converted: Array = array.astype(dtype)
    except (FloatingPointError, OverflowError):
        raise InvalidInput(f"input {name!r} ({datatype}): a value in \"data\" is beyond {datatype}'s largest "
                           f"finite value {np.finfo(dtype).max}") from None
    return converted


def _first(values: Sequence[Any], wrong: Callable[[Any], bool]) -> tuple[int, Any]:
    for index, value in enumerate(values):
        if wrong(value):
            return index, value
    return -1, None


def _wrong_type(name: str, datatype: str, kind: str, index: int, value: Any) -> InvalidInput:
    if isinstance(value, float) and not math.isfinite(value):
        text = "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"  # orjson writes null
    else:
        try:
            text = orjson.dumps(value).decode()
        except TypeError:
            text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return InvalidInput(f"input {name!r} ({datatype}): \"data\" element {index} is {text}; {datatype} data "
                        f"must be {_EXPECTED[kind]}")

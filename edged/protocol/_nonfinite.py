"""NaN and ±Infinity in JSON tensor data, read and written as Triton does.

Strict JSON has no literal for them. Triton's HTTP front end reads ``NaN``, ``Infinity`` and ``-Infinity`` in
a request and writes them in a response's ``data`` (rapidjson with its NaN/Inf flags), and its Python client
writes and reads them (rapidjson; Python's json module does the same), so a float tensor holding one crosses
JSON intact. orjson refuses the literals and writes null, which lost the value (-inf came back NaN) and refused
tritonclient's JSON requests. Here a body that orjson refuses and that holds such a literal is parsed again by
Python's json (the rare path: other bodies cost nothing more), and a float array holding such a value is
written with the literals.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import orjson

Array = np.ndarray[Any, Any]

_LITERAL = re.compile(rb"NaN|Infinity")


def loads(data: bytes | bytearray) -> Any:
    """``orjson.loads``, also taking the literals NaN, Infinity and -Infinity as numbers; any other text orjson
    refuses raises orjson's error."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as refused:
        if _LITERAL.search(data) is None:
            raise
        try:
            doc = json.loads(bytes(data).decode("utf-8"))
            # what orjson refuses besides the literals (lone surrogates, nesting past its limit) stays refused
            orjson.dumps(doc)
        except (ValueError, RecursionError, TypeError, orjson.JSONEncodeError):
            raise refused from None
        return doc


def has_nonfinite(array: Array) -> bool:
    return array.dtype.kind == "f" and array.size > 0 and not bool(np.isfinite(array).all())


def data_fragment(flat: Array, finite_json: bytes) -> orjson.Fragment:
    """The JSON list for ``flat`` (a 1-d float array): ``finite_json`` is its finite values' JSON list with the
    non-finite ones written as 0, whose places get the literals."""
    numbers = finite_json[1:-1].split(b",")
    for index in np.flatnonzero(~np.isfinite(flat)):
        value = flat[index]
        numbers[index] = b"NaN" if np.isnan(value) else b"Infinity" if value > 0 else b"-Infinity"
    return orjson.Fragment(b"[" + b",".join(numbers) + b"]")

"""BYTES tensors in the codec: the vectorised encoder and decoder against the element-by-element reference.

The reference below is the codec's former code, one element at a time (the semantics the wire contract was
written against): each element a 4-byte little-endian length then its bytes, str elements as UTF-8, anything
else through ``bytes()``; JSON output text decoded as UTF-8 with replacement. Sizes cross the points where the
codec changes method (``_VECTOR_MIN``, ``_PIECE``), and elements are empty, not UTF-8, NUL-ended or long.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edged.errors import InvalidInput
from edged.protocol import decode_request, encode_request, encode_response
from edged.protocol.codec import _PIECE, _VECTOR_MIN, tensor_bytes, tensor_from_bytes

_LENGTH = struct.Struct("<I")


def reference_bytes(array: np.ndarray) -> bytes:
    parts = []
    for item in array.ravel():
        raw = item.encode() if isinstance(item, str) else bytes(item)
        parts.append(_LENGTH.pack(len(raw)))
        parts.append(raw)
    return b"".join(parts)


def reference_elements(raw: bytes) -> list[bytes]:
    items, position = [], 0
    while position < len(raw):
        (length,) = _LENGTH.unpack_from(raw, position)
        items.append(raw[position + 4:position + 4 + length])
        position += 4 + length
    return items


def objects(items: list[Any]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


class Response:
    def __init__(self, outputs: dict[str, np.ndarray]) -> None:
        self.model, self.version, self.id, self.outputs, self.parameters = "m", "1", "", outputs, {}


ELEMENT = st.one_of(st.binary(max_size=40), st.text(max_size=20),
                    st.sampled_from([b"", "", b"\x00", b"\xff\xfe", b"a\x00", "ü", "\U0001f600"]))


@settings(max_examples=200, deadline=None)
@given(st.lists(ELEMENT, max_size=3 * _VECTOR_MIN))
def test_encoded_bytes_equal_the_reference_and_decode_back(items: list[Any]) -> None:
    array = objects(items)
    raw = tensor_bytes(array)
    assert raw == reference_bytes(array)
    decoded = tensor_from_bytes("x", memoryview(raw), np.dtype(object), (len(items),))
    assert decoded.tolist() == reference_elements(raw)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=3, max_size=3), min_size=_VECTOR_MIN, max_size=4 * _VECTOR_MIN))
def test_equal_length_elements_decode_as_the_walk_does(items: list[bytes]) -> None:
    raw = reference_bytes(objects(items))
    assert tensor_from_bytes("x", memoryview(raw), np.dtype(object), (len(items),)).tolist() == items


@pytest.mark.parametrize("count", [0, 1, _VECTOR_MIN - 1, _VECTOR_MIN, _PIECE - 1, _PIECE, _PIECE + 1,
                                   2 * _PIECE + 7])
@pytest.mark.parametrize("kind", ["ascii", "unicode", "bytes", "empty", "mixed", "fixed"])
def test_sizes_across_the_codec_thresholds(count: int, kind: str) -> None:
    make = {"ascii": lambda i: f"e{i % 1000}", "unicode": lambda i: f"ü{i}",
            "bytes": lambda i: bytes([i % 256]) * (i % 5), "empty": lambda i: b"",
            "mixed": lambda i: f"t{i}" if i % 3 else b"\xff%d" % i, "fixed": lambda i: b"%05d\x00" % (i % 99999)}
    array = objects([make[kind](i) for i in range(count)])
    raw = tensor_bytes(array)
    assert raw == reference_bytes(array)
    decoded = tensor_from_bytes("x", memoryview(raw), np.dtype(object), (count,))
    assert decoded.tolist() == reference_elements(raw)


def test_long_elements_and_numpy_string_arrays_encode_as_the_reference() -> None:
    long = objects([b"x" * (3 << 20), b"", "y" * (1 << 20)] * (_VECTOR_MIN // 3 + 1))
    assert tensor_bytes(long) == reference_bytes(long)
    for array in (np.array([b"ab", b"c\x00d", b""] * _VECTOR_MIN, dtype="S3"),
                  np.array(["ab", "ü", ""] * _VECTOR_MIN, dtype="U2").reshape(-1, 3)):
        assert tensor_bytes(array) == reference_bytes(array)


def test_elements_that_are_neither_str_nor_bytes_go_through_bytes_as_before() -> None:
    items = [bytearray(b"ab"), memoryview(b"cd"), np.bytes_(b"ef"), b"gh"] * _VECTOR_MIN
    array = objects(items)
    assert tensor_bytes(array) == reference_bytes(array)
    wide = objects([memoryview(np.arange(2, dtype=np.int32)).cast("B").cast("i")] * _VECTOR_MIN)
    assert tensor_bytes(wide) == reference_bytes(wide)  # its len (2) is not its byte count (8)


@pytest.mark.parametrize("count", [3, 2 * _VECTOR_MIN])
def test_bytes_data_that_does_not_fit_its_shape_says_what_is_wrong(count: int) -> None:
    raw = reference_bytes(objects([b"abc"] * count))
    with pytest.raises(InvalidInput, match="found 3 BYTES elements, expected 4|"
                                           f"found {count} BYTES elements, expected {count + 1}"):
        tensor_from_bytes("x", memoryview(raw), np.dtype(object), (count + 1,))
    with pytest.raises(InvalidInput, match="runs past the data"):
        tensor_from_bytes("x", memoryview(raw[:-1]), np.dtype(object), (count,))
    with pytest.raises(InvalidInput, match="truncated BYTES element length"):
        tensor_from_bytes("x", memoryview(raw + b"\x01\x00"), np.dtype(object), (count + 1,))


@pytest.mark.parametrize("count", [3, 2 * _PIECE + 1])
def test_json_bytes_outputs_are_text_as_before(count: int) -> None:
    items = [b"\xff\xfe" if i % 4 == 0 else f"ü{i}" if i % 4 == 1 else b"ok" if i % 4 == 2 else ""
             for i in range(count)]
    for values in (items, [b"b%d" % i for i in range(count)], [f"s{i}" for i in range(count)]):
        body, _ = encode_response(Response({"o": objects(values)}), {}, False)
        data = orjson.loads(body)["outputs"][0]["data"]
        assert data == [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in values]


@pytest.mark.parametrize("count", [2, 2 * _PIECE + 1])
def test_json_bytes_inputs_decode_and_a_wrong_element_is_named(count: int) -> None:
    values = [f"ü{i}" if i % 2 else "" for i in range(count)]
    body, _ = encode_request({"s": objects([v.encode() for v in values])}, binary=False)
    assert decode_request(body, None).inputs["s"].tolist() == [v.encode() for v in values]
    doc = orjson.loads(body)
    doc["inputs"][0]["data"][count - 1] = 5
    with pytest.raises(InvalidInput, match=f"element {count - 1}"):
        decode_request(orjson.dumps(doc), None)

"""The KServe v2 codec: round trips in JSON and binary, and hostile bodies that must fail with InvalidInput."""

from __future__ import annotations

import contextlib
import struct

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edged.errors import InvalidInput
from edged.protocol import decode_request, decode_response, encode_request, encode_response
from edged.protocol.codec import DecodedRequest


class Response:
    def __init__(self, outputs: dict) -> None:
        self.model, self.version, self.id, self.outputs, self.parameters = "m", "1", "r1", outputs, {}


@pytest.mark.parametrize("binary", [True, False])
def test_requests_round_trip_every_datatype(binary: bool) -> None:
    inputs = {
        "f32": np.arange(6, dtype=np.float32).reshape(2, 3), "f16": np.ones((2,), np.float16),
        "i64": np.array([[-5, 7]], np.int64), "u8": np.array([0, 255], np.uint8), "b": np.array([True, False]),
        "s": np.array([b"abc", b"\x00\xff" if binary else "ünï".encode()], dtype=object),
    }
    body, header = encode_request(inputs, binary=binary, request_id="x")
    decoded = decode_request(body, header)
    assert decoded.id == "x" and decoded.binary_default is binary
    for name, array in inputs.items():
        assert decoded.inputs[name].shape == array.shape
        if array.dtype == object:
            assert list(decoded.inputs[name].ravel()) == list(array.ravel())
        else:
            np.testing.assert_array_equal(decoded.inputs[name], array)


@pytest.mark.parametrize("binary", [True, False])
def test_responses_round_trip(binary: bool) -> None:
    out = {"y": np.arange(4, dtype=np.float32).reshape(2, 2), "labels": np.array([b"cat", b"dog"], dtype=object)}
    body, header = encode_response(Response(out), {}, binary)
    doc, outputs = decode_response(body, header)
    assert doc["model_name"] == "m" and doc["id"] == "r1"
    np.testing.assert_array_equal(outputs["y"], out["y"])
    assert list(outputs["labels"]) == [b"cat", b"dog"]


def test_nested_json_data_is_flattened_as_triton_does() -> None:
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "INT32", "shape": [2, 2], "data": [[1, 2], [3, 4]]}]})
    np.testing.assert_array_equal(decode_request(body, None).inputs["x"], [[1, 2], [3, 4]])


@pytest.mark.parametrize("values", [[1, 2**63], [0, 2**64 - 1], [2**64 - 1], [2**63 - 1, 2**63, 7]])
def test_uint64_json_data_keep_every_value_of_the_full_range(values: list[int]) -> None:
    # what tritonclient.http sends for np.iinfo(np.uint64) values without binary data
    body = b'{"inputs": [{"name": "x", "datatype": "UINT64", "shape": [%d], "data": [%s]}]}' % (
        len(values), ",".join(map(str, values)).encode())
    array = decode_request(body, None).inputs["x"]
    assert array.dtype == np.uint64 and array.tolist() == values


@pytest.mark.parametrize(("body", "header", "fragment"), [
    (b"{not json", None, "not valid JSON"),
    (b"[]", None, "JSON object"),
    (b'{"inputs": []}', None, "non-empty \"inputs\""),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1]}]}', None, "1 values for shape [2]"),
    (b'{"inputs": [{"name": "x", "datatype": "FP99", "shape": [1], "data": [1]}]}', None, "unknown or unsupported"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1], "data": [1]}]}', None, "non-negative integers"),
    (b'{"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [300]}]}', None,
     "input 'x' (INT8): \"data\" element 0 is 300, outside INT8's range -128..127"),
    # as Triton's JSON reader: integers for the INT/UINT types, numbers for FP, true/false for BOOL, strings
    # for BYTES; the error names the input, its datatype and the element
    (b'{"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [1.5]}]}', None,
     "input 'x' (INT32): \"data\" element 0 is 1.5; INT32 data must be JSON integers"),
    (b'{"inputs": [{"name": "x", "datatype": "INT64", "shape": [2], "data": [1.0, 2]}]}', None,
     "input 'x' (INT64): \"data\" element 0 is 1.0; INT64 data must be JSON integers"),
    (b'{"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [1e3]}]}', None,
     "element 0 is 1000.0; INT32 data must be JSON integers"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": ["a"]}]}', None,
     "input 'x' (FP32): \"data\" element 0 is \"a\"; FP32 data must be JSON numbers"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": ["NaN", 1]}]}', None,
     "element 0 is \"NaN\"; FP32 data must be JSON numbers"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [true, false]}]}', None,
     "element 0 is true; FP32 data must be JSON numbers"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1.5, true]}]}', None,
     "element 1 is true; FP32 data must be JSON numbers"),
    (b'{"inputs": [{"name": "x", "datatype": "INT32", "shape": [2], "data": [1, true]}]}', None,
     "element 1 is true; INT32 data must be JSON integers"),
    (b'{"inputs": [{"name": "x", "datatype": "BOOL", "shape": [2], "data": [1, 0]}]}', None,
     "input 'x' (BOOL): \"data\" element 0 is 1; BOOL data must be JSON true/false"),
    (b'{"inputs": [{"name": "x", "datatype": "BOOL", "shape": [2], "data": [true, "false"]}]}', None,
     "element 1 is \"false\"; BOOL data must be JSON true/false"),
    (b'{"inputs": [{"name": "x", "datatype": "BYTES", "shape": [2], "data": ["a", 5]}]}', None,
     "input 'x' (BYTES): \"data\" element 1 is 5; BYTES data must be JSON strings"),
    (b'{"inputs": [{"name": "x", "datatype": "UINT64", "shape": [2], "data": [-1, 9223372036854775808]}]}', None,
     "element 0 is -1, outside UINT64's range 0..18446744073709551615"),
    (b'{"inputs": [{"name": "x", "datatype": "INT64", "shape": [2], "data": [1, 9223372036854775808]}]}', None,
     "element 1 is 9223372036854775808, outside INT64's range"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}]}abcd',
     500, "Inference-Header-Content-Length is 500"),
])
def test_bad_bodies_say_what_is_wrong(body: bytes, header: int | None, fragment: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        decode_request(body, header)
    assert fragment in str(caught.value)


def test_binary_sizes_that_disagree_with_the_body_are_refused() -> None:
    header = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2],
                                       "parameters": {"binary_data_size": 8}}]})
    with pytest.raises(InvalidInput, match="goes past the end"):
        decode_request(header + b"\x00" * 4, len(header))
    with pytest.raises(InvalidInput, match="add up to 8"):
        decode_request(header + b"\x00" * 12, len(header))
    bytes_header = orjson.dumps({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [1],
                                             "parameters": {"binary_data_size": 6}}]})
    with pytest.raises(InvalidInput, match="runs past the data"):
        decode_request(bytes_header + struct.pack("<I", 10) + b"ab", len(bytes_header))


def test_the_element_limit_applies_before_any_allocation() -> None:
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [100000, 100000], "data": [0]}]})
    with pytest.raises(InvalidInput, match="more than the limit"):
        decode_request(body, None, max_elements=1000)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.one_of(st.none(), st.integers(min_value=-5, max_value=400)))
def test_arbitrary_bytes_raise_only_invalid_input(body: bytes, header: int | None) -> None:
    try:
        result = decode_request(body, header)
    except InvalidInput:
        return
    assert isinstance(result, DecodedRequest)


json_values = st.recursive(st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1)
                           | st.floats() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                      max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["name", "datatype", "shape", "data", "parameters"]), json_values),
                max_size=3), json_values)
def test_structurally_hostile_json_raises_only_invalid_input(inputs: list, outputs: object) -> None:
    body = orjson.dumps({"inputs": inputs, "outputs": outputs})
    with contextlib.suppress(InvalidInput):
        decode_request(body, None, max_elements=10_000)

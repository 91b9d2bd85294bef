"""Large JSON infer bodies decode to the same arrays as the whole-body orjson parse, and refuse the same."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edged.errors import InvalidInput
from edged.protocol import decode_request
from edged.protocol._jsondata import SPLIT_MIN_BYTES, split_data

ELEMENTS = 40_000  # a body well past SPLIT_MIN_BYTES


def body_of(tensors: list[dict[str, object]], **extra: object) -> bytes:
    return orjson.dumps({"inputs": tensors, **extra})


def reference(values: list[float], dtype: str) -> np.ndarray:
    return np.asarray(values).astype(dtype)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), dtype=st.sampled_from(["float32", "float64", "float16"]))
def test_large_float_data_decodes_exactly_as_through_python_floats(seed: int, dtype: str) -> None:
    rng = np.random.default_rng(seed)
    scale = {"float16": 4.0, "float32": 30.0, "float64": 300.0}[dtype]
    values = (rng.standard_normal(ELEMENTS) * 10.0 ** rng.uniform(-scale, scale, ELEMENTS)).tolist()
    values[:4] = [0.0, -0.0, 5e-324 if dtype == "float64" else 1e-45, 1]
    body = body_of([{"name": "x", "datatype": {"float32": "FP32", "float64": "FP64", "float16": "FP16"}[dtype],
                     "shape": [ELEMENTS // 8, 8], "data": values}])
    assert len(body) > SPLIT_MIN_BYTES and split_data(body) is not None
    array = decode_request(body, None).inputs["x"]
    expected = reference(values, dtype).reshape(ELEMENTS // 8, 8)
    assert array.dtype == expected.dtype and np.array_equal(array, expected)
    assert np.array_equal(np.signbit(array), np.signbit(expected))


def _text_body(data: bytes, datatype: str = "FP32", count: int = ELEMENTS) -> bytes:
    return (b'{"inputs":[{"name":"x","datatype":"%s","shape":[%d],"data":[%s]}]}'
            % (datatype.encode(), count, data))


@pytest.mark.parametrize(("damage", "datatype"), [
    (b"1 2", "FP32"), (b"1,,2", "FP32"), (b"1,2,", "FP32"), (b"nan", "FP32"), (b"1e39", "FP32"),
    (b"1e999", "FP64"), (b"1.2.3", "FP32"), (b"e5", "FP32"), (b"-", "FP32"),
])
def test_malformed_or_overflowing_numbers_are_refused(damage: bytes, datatype: str) -> None:
    good = b",".join([b"0.1234567"] * (ELEMENTS - 2))
    body = _text_body(good + b"," + damage, datatype, ELEMENTS)
    assert split_data(body) is not None
    with pytest.raises(InvalidInput):
        decode_request(body, None)


def test_a_count_that_disagrees_with_the_shape_is_refused() -> None:
    body = _text_body(b",".join([b"1.0000001"] * (ELEMENTS - 1)))
    assert split_data(body) is not None
    with pytest.raises(InvalidInput, match="values"):
        decode_request(body, None)


def test_integer_and_bool_data_go_through_json_and_keep_their_checks() -> None:
    values = list(range(10**6, 10**6 + ELEMENTS))
    body = body_of([{"name": "x", "datatype": "INT32", "shape": [ELEMENTS], "data": values}])
    assert split_data(body) is not None
    assert np.array_equal(decode_request(body, None).inputs["x"], np.asarray(values, dtype=np.int32))
    with pytest.raises(InvalidInput, match=r"element 0 is 1\.5; INT32 data must be JSON integers"):
        decode_request(_text_body(b",".join([b"1.5000000"] * ELEMENTS), "INT32"), None)


def test_an_element_refused_in_a_later_piece_is_named_by_its_index_in_the_whole_data() -> None:
    values = [b"0.2500000"] * ELEMENTS
    values[ELEMENTS - 3] = b"true"
    body = _text_body(b",".join(values))
    assert split_data(body) is not None
    with pytest.raises(InvalidInput, match=f"element {ELEMENTS - 3} is true; FP32 data must be JSON numbers"):
        decode_request(body, None)


def test_a_placeholder_written_by_the_client_is_only_its_own_string() -> None:
    values = [0.25] * ELEMENTS
    body = body_of([{"name": "s", "datatype": "BYTES", "shape": [1], "data": ["\x00edged-data:0"]},
                    {"name": "x", "datatype": "FP32", "shape": [ELEMENTS], "data": values}],
                   parameters={"data": values})
    decoded = decode_request(body, None)
    assert decoded.inputs["s"].tolist() == [b"\x00edged-data:0"]
    assert np.array_equal(decoded.inputs["x"], np.full(ELEMENTS, 0.25, np.float32))
    assert decoded.parameters["data"] == values


def test_nested_data_is_still_accepted() -> None:
    values = [[0.5] * 8] * (ELEMENTS // 8)
    body = body_of([{"name": "x", "datatype": "FP32", "shape": [ELEMENTS // 8, 8], "data": values}])
    assert decode_request(body, None).inputs["x"].shape == (ELEMENTS // 8, 8)


def test_decoding_a_large_json_body_allocates_about_the_array_not_a_float_per_element() -> None:
    import tracemalloc

    count = 1_000_000
    body = _text_body(b",".join([b"0.123456"] * count), "FP32", count)
    tracemalloc.start()
    try:
        array = decode_request(body, None).inputs["x"]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Through Python floats in a list it is 32 bytes an element (8x the FP32 array) on top of the body; in
    # pieces it is the array plus one piece's floats (a constant).
    assert array.nbytes == 4 * count and peak < 2 * array.nbytes + 4 * 1024 * 1024, peak


_tricky_text = st.lists(st.sampled_from(['"', "\\", "[", "]", ",", ":", "data", '"data":[' + "1," * 3000 + "2]",
                                         "a", " ", "\x00", "é", "}", "\x00edged-data:0"]),
                        max_size=8).map("".join)


@settings(max_examples=60, deadline=None)
@given(strings=st.lists(_tricky_text, min_size=1, max_size=4), request_id=_tricky_text, key=_tricky_text)
def test_strings_that_look_like_data_arrays_never_confuse_the_split(strings: list[str], request_id: str,
                                                                    key: str) -> None:
    values = [0.5] * ELEMENTS
    body = body_of([{"name": "s", "datatype": "BYTES", "shape": [len(strings)], "data": strings},
                    {"name": "x", "datatype": "FP32", "shape": [ELEMENTS], "data": values}],
                   id=request_id, parameters={key: strings})
    decoded = decode_request(body, None)
    assert decoded.inputs["s"].tolist() == [text.encode() for text in strings]
    assert np.array_equal(decoded.inputs["x"], np.full(ELEMENTS, 0.5, np.float32))
    assert decoded.id == request_id and decoded.parameters == {key: strings}

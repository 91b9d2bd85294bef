"""HeaderCache: a repeated binary header decodes like decode_request, and only what is safe to keep is kept."""

from __future__ import annotations

import numpy as np
import pytest

from edged.errors import InvalidInput
from edged.protocol import decode_request, encode_request
from edged.protocol.header_cache import MAX_ENTRIES, HeaderCache


def _binary(array: np.ndarray, **kwargs: object) -> tuple[bytes, int]:
    body, header_length = encode_request({"x": array}, outputs=["y"], **kwargs)  # type: ignore[arg-type]
    assert header_length is not None
    return body, header_length


def test_binary_inputs_are_views_of_the_native_dtype() -> None:
    # The engine's quick input check compares dtypes by identity: an equal copy sent each request the long way.
    body, header_length = _binary(np.arange(4, dtype=np.float32))
    assert decode_request(body, header_length).inputs["x"].dtype is np.dtype(np.float32)
    assert HeaderCache(1 << 20).decode(body, header_length).inputs["x"].dtype is np.dtype(np.float32)


def test_a_repeated_header_decodes_each_request_own_data_like_decode_request() -> None:
    cache = HeaderCache(1 << 20)
    first, header_length = _binary(np.zeros((2, 3), np.float32), request_id="r", parameters={"priority": 2})
    cache.decode(first, header_length)
    assert len(cache) == 1
    second, same_length = _binary(np.arange(6, dtype=np.float32).reshape(2, 3), request_id="r",
                                  parameters={"priority": 2})
    assert same_length == header_length and second[:header_length] == first[:header_length]
    cached = cache.decode(second, header_length)
    full = decode_request(second, header_length)
    np.testing.assert_array_equal(cached.inputs["x"], full.inputs["x"])
    assert cached.inputs["x"].shape == (2, 3)
    assert (cached.outputs, cached.id, cached.parameters, cached.priority, cached.binary_outputs,
            cached.binary_default) == (full.outputs, full.id, full.parameters, full.priority, full.binary_outputs,
                                       full.binary_default)


def test_each_request_gets_its_own_parameters() -> None:
    cache = HeaderCache(1 << 20)
    body, header_length = _binary(np.zeros(3, np.float32))
    cache.decode(body, header_length).parameters["changed"] = True
    assert "changed" not in cache.decode(body, header_length).parameters


def test_data_that_does_not_match_the_cached_header_gets_decode_requests_error() -> None:
    cache = HeaderCache(1 << 20)
    body, header_length = _binary(np.zeros(3, np.float32))
    cache.decode(body, header_length)
    with pytest.raises(InvalidInput) as full:
        decode_request(body[:-4], header_length)
    with pytest.raises(InvalidInput) as cached:
        cache.decode(body[:-4], header_length)
    assert str(cached.value) == str(full.value)


@pytest.mark.parametrize("case", ["bytes", "json"])
def test_headers_of_bytes_or_json_inputs_are_not_kept(case: str) -> None:
    cache = HeaderCache(1 << 20)
    if case == "bytes":
        body, header_length = _binary(np.array([b"ab", b"c"], dtype=object))
        decoded = cache.decode(body, header_length)
        assert list(decoded.inputs["x"]) == [b"ab", b"c"]
    else:
        body, json_length = encode_request({"x": np.zeros(2, np.float32)}, binary=False)
        assert json_length is None
        cache.decode(body, None)
    assert len(cache) == 0


def test_the_cache_stays_bounded_when_every_header_differs() -> None:
    cache = HeaderCache(1 << 20)
    for index in range(MAX_ENTRIES * 2 + 1):
        body, header_length = _binary(np.zeros(2, np.float32), request_id=f"request-{index}")
        assert cache.decode(body, header_length).id == f"request-{index}"
        assert len(cache) <= MAX_ENTRIES

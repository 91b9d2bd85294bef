"""An input whose shape has a zero dimension beside huge ones, over the real Unix socket: 413 naming the shape
(its non-zero dimensions pass max_tensor_elements), never a 500 from numpy ("array is too big"); a zero batch
alone is 400 naming the batch size. A guard: the shape check in edged/protocol/_shapes.py already answers so."""

from __future__ import annotations

import orjson
import pytest
from conftest import RunningServer

INFER = "/v2/models/tiny_mlp/infer"


@pytest.mark.parametrize(("shape", "status", "fragment"), [
    ([0, 2**31, 2**31], 413, "shape [0, 2147483648, 2147483648]"),
    ([2**40, 0], 413, "shape [1099511627776, 0]"),
    ([0, 2**62, 2**62, 2**62], 413, "shape [0, 4611686018427387904"),
    ([0, 64], 400, "batch size 0"),
], ids=["two-huge", "huge-first", "past-int64", "zero-batch"])
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_a_zero_dimension_beside_huge_ones_is_refused_naming_the_shape(server: RunningServer, shape: list[int],
                                                                       status: int, fragment: str,
                                                                       binary: bool) -> None:
    entry: dict[str, object] = {"name": "input", "datatype": "FP32", "shape": shape}
    entry.update({"parameters": {"binary_data_size": 0}} if binary else {"data": []})
    header = orjson.dumps({"inputs": [entry]})
    headers = {"Inference-Header-Content-Length": str(len(header))} if binary else {}
    got, _, reply = server.request("POST", INFER, header, headers)
    assert got == status, reply
    assert fragment in orjson.loads(reply)["error"], reply
    assert server.request("GET", "/v2/health/live")[0] == 200

"""edged answers KServe v2 HTTP requests as Triton does, on Identity models of every datatype.

The expected values were observed on Triton 2.51 (the nvidia-pytriton 0.7.0 wheel that
scripts/bench_vs_triton.py starts) answering the same requests on the same models; Triton itself is not
needed here.
"""

from __future__ import annotations

import http.client
from collections.abc import Iterator

import orjson
import pytest
import server_harness as harness
from modelgen import add_identity_model

DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
             "FP64", "BYTES")


@pytest.fixture(scope="module")
def server() -> Iterator[harness.ThreadedServer]:
    running = harness.ThreadedServer(models=("tiny_mlp",), tcp=True)
    for datatype in DATATYPES:
        add_identity_model(running.repository, f"id_{datatype.lower()}", datatype)
    running.start()
    yield running
    running.stop()


def post(server: harness.ThreadedServer, path: str, body: bytes,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    assert server.port is not None
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("POST", path, body, headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def classes(server: harness.ThreadedServer, datatype: str, data: list[object], count: int) -> list[str]:
    body = orjson.dumps({"inputs": [{"name": "INPUT", "datatype": datatype, "shape": [1, len(data)], "data": data}],
                         "outputs": [{"name": "OUTPUT", "parameters": {"classification": count}}]})
    status, _, reply = post(server, f"/v2/models/id_{datatype.lower()}/infer", body)
    assert status == 200, reply
    output = orjson.loads(reply)["outputs"][0]
    assert output["datatype"] == "BYTES" and output["shape"] == [1, count]
    top: list[str] = output["data"]
    return top


# Triton 2.51 writes an integer output's score as the integer (std::to_string of the element): "5:1"
@pytest.mark.parametrize("datatype", ["UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"])
def test_classification_of_an_integer_output_writes_integer_scores(server: harness.ThreadedServer,
                                                                   datatype: str) -> None:
    signed = datatype.startswith("INT")
    assert classes(server, datatype, [1, 5, 3], 2) == ["5:1", "3:2"]
    if signed:
        assert classes(server, datatype, [-1, -5, -3], 2) == ["-1:0", "-3:2"]


def test_classification_ranks_zero_below_every_unsigned_value_and_the_minimum_below_every_signed_one(
        server: harness.ThreadedServer) -> None:
    assert classes(server, "UINT8", [0, 200, 7], 3) == ["200:1", "7:2", "0:0"]
    assert classes(server, "INT8", [-128, 0, 127], 3) == ["127:2", "0:1", "-128:0"]
    assert classes(server, "INT64", [-2 ** 63, 2 ** 63 - 1, 2 ** 63 - 2], 3) == [
        f"{2 ** 63 - 1}:1", f"{2 ** 63 - 2}:2", f"{-2 ** 63}:0"]


def test_classification_of_a_float_output_writes_six_decimals(server: harness.ThreadedServer) -> None:
    assert classes(server, "FP64", [1e-9, 5e-9, 3.5], 2) == ["3.500000:2", "0.000000:1"]


def test_classification_of_a_bool_output_is_answered(server: harness.ThreadedServer) -> None:
    # Triton 2.51 refuses BOOL with a 400; edged ranks true above false (its error text names BOOL as classifiable)
    assert classes(server, "BOOL", [False, True, False], 2) == ["1:1", "0:0"]

"""edged answers KServe v2 HTTP requests as Triton does, on Identity models of every datatype.

The expected values were observed on Triton 2.51 (the nvidia-pytriton 0.7.0 wheel that
scripts/bench_vs_triton.py starts) answering the same requests on the same models; Triton itself is not
needed here.
"""

from __future__ import annotations

import http.client
import os
import socket
from collections.abc import Iterator

import numpy as np
import orjson
import pytest
import server_harness as harness
from modelgen import add_identity_model

from edged.client import EdgedClient

DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
             "FP64", "BYTES")


@pytest.fixture(scope="module")
def server() -> Iterator[harness.ThreadedServer]:
    running = harness.ThreadedServer(models=("tiny_mlp",), tcp=True)
    for datatype in DATATYPES:
        add_identity_model(running.repository, f"id_{datatype.lower()}", datatype)
    broken = running.repository / "broken_mlp"  # a model whose load fails: its file is not ONNX
    (broken / "1").mkdir(parents=True)
    (broken / "config.pbtxt").write_text((running.repository / "tiny_mlp" / "config.pbtxt").read_text()
                                         .replace('"tiny_mlp"', '"broken_mlp"'))
    (broken / "1" / "model.onnx").write_bytes(b"not an onnx file")
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


# --- NaN and ±Infinity in JSON data ---------------------------------------------------------------------------
# Triton 2.51 reads the literals NaN, Infinity and -Infinity in a request's JSON and writes them in a response's
# data: {"inputs":[{..."FP32","shape":[1,4],"data":[NaN,Infinity,-Infinity,1]}]} was answered 200 with
# "data":[NaN,Infinity,-Infinity,1.0]. tritonclient (binary_data=False) sends and reads them so.
NONFINITE_BODY = (b'{"inputs":[{"name":"INPUT","datatype":"FP32","shape":[1,4],'
                  b'"data":[NaN,Infinity,-Infinity,1]}]}')


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64"])
def test_nonfinite_literals_in_json_data_cross_both_ways(server: harness.ThreadedServer, datatype: str) -> None:
    body = NONFINITE_BODY.replace(b"FP32", datatype.encode())
    status, _, reply = post(server, f"/v2/models/id_{datatype.lower()}/infer", body)
    assert status == 200, reply
    assert b'"data":[NaN,Infinity,-Infinity,1.0]' in reply


def test_nonfinite_literals_in_a_large_json_body_are_read(server: harness.ThreadedServer) -> None:
    values = ["1.5"] * 100_000
    values[7], values[50_000], values[-1] = "NaN", "-Infinity", "Infinity"
    body = (b'{"inputs":[{"name":"INPUT","datatype":"FP32","shape":[1,100000],"data":[' + ",".join(values).encode()
            + b"]}],\"outputs\":[{\"name\":\"OUTPUT\",\"parameters\":{\"binary_data\":true}}]}")
    status, headers, reply = post(server, "/v2/models/id_fp32/infer", body)
    assert status == 200, reply[:300]
    out = np.frombuffer(reply[int(headers["inference-header-content-length"]):], np.float32)
    assert np.isnan(out[7]) and out[50_000] == -np.inf and out[-1] == np.inf and out[0] == 1.5


def test_a_nonfinite_literal_for_an_integer_input_is_named(server: harness.ThreadedServer) -> None:
    body = NONFINITE_BODY.replace(b"FP32", b"INT32")
    status, _, reply = post(server, "/v2/models/id_int32/infer", body)
    assert status == 400
    assert orjson.loads(reply)["error"] == ("input 'INPUT' (INT32): \"data\" element 0 is NaN; INT32 data must be "
                                            "JSON integers")


def test_a_body_that_is_not_json_is_still_refused_when_it_holds_a_literal(server: harness.ThreadedServer) -> None:
    for body in (NONFINITE_BODY[:-2], NONFINITE_BODY.replace(b"1]", b"1,]"),
                 NONFINITE_BODY.replace(b'"INPUT"', b'"\\ud800"')):
        status, _, reply = post(server, "/v2/models/id_fp32/infer", body)
        assert status == 400 and orjson.loads(reply)["error"].startswith("request body is not valid JSON: "), reply


def test_tritonclient_sends_and_reads_nonfinite_values_as_json(server: harness.ThreadedServer) -> None:
    httpclient = pytest.importorskip("tritonclient.http")
    x = np.array([[1.5, np.nan, np.inf, -np.inf]], np.float64)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    try:
        tensor = httpclient.InferInput("INPUT", list(x.shape), "FP64")
        tensor.set_data_from_numpy(x, binary_data=False)
        result = client.infer("id_fp64", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT",
                                                                                             binary_data=False)])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT"), x)
    finally:
        client.close()


def test_the_edged_client_reads_nonfinite_values_from_json(server: harness.ThreadedServer) -> None:
    x = np.array([[np.nan, -np.inf, 2.0]], np.float32)
    with EdgedClient(server.socket_path) as client:
        out = client.infer("id_fp32", {"INPUT": x}, binary=False).as_numpy("OUTPUT")
    np.testing.assert_array_equal(out, x)


# --- which outputs come back as binary data -------------------------------------------------------------------
# Triton 2.51: parameters.binary_data_output is the default only for the outputs a request does not name; an
# output named in "outputs" is binary only when its own parameters say binary_data true.
JSON_INPUT = {"name": "INPUT", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}


@pytest.mark.parametrize(("outputs", "binary"), [
    (None, True),
    ([{"name": "OUTPUT"}], False),
    ([{"name": "OUTPUT", "parameters": {}}], False),
    ([{"name": "OUTPUT", "parameters": {"binary_data": False}}], False),
    ([{"name": "OUTPUT", "parameters": {"binary_data": True}}], True),
])
def test_binary_data_output_applies_only_to_outputs_the_request_does_not_name(
        server: harness.ThreadedServer, outputs: list[dict[str, object]] | None, binary: bool) -> None:
    doc: dict[str, object] = {"inputs": [JSON_INPUT], "parameters": {"binary_data_output": True}}
    if outputs is not None:
        doc["outputs"] = outputs
    status, headers, reply = post(server, "/v2/models/id_fp32/infer", orjson.dumps(doc))
    assert status == 200, reply
    assert ("inference-header-content-length" in headers) is binary
    if not binary:
        assert orjson.loads(reply)["outputs"][0]["data"] == [1.0, 2.0, 3.0]


# --- system shared memory -------------------------------------------------------------------------------------
class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=10)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self.path)


def unix_post(server: harness.ThreadedServer, path: str, body: bytes) -> tuple[int, bytes]:
    conn = UnixConnection(server.socket_path)
    try:
        conn.request("POST", path, body)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_registering_a_region_name_twice_is_a_400_as_on_triton(server: harness.ThreadedServer) -> None:
    # Triton 2.51 over HTTP: 400 {"error":"shared memory region 'r1' already in manager"} (gRPC: ALREADY_EXISTS)
    key = f"/edged-ct-{os.getpid()}"
    fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 4096)
        register = orjson.dumps({"key": key, "offset": 0, "byte_size": 64})
        assert unix_post(server, "/v2/systemsharedmemory/region/r1/register", register) == (200, b"")
        status, reply = unix_post(server, "/v2/systemsharedmemory/region/r1/register", register)
        assert (status, orjson.loads(reply)) == (400, {"error": "shared memory region 'r1' already in manager"})
        assert unix_post(server, "/v2/systemsharedmemory/region/r1/unregister", b"") == (200, b"")
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm{key}")


# --- statistics -------------------------------------------------------------------------------------------------
def get(server: harness.ThreadedServer, path: str) -> tuple[int, bytes]:
    assert server.port is not None
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@pytest.mark.parametrize("path", ["/v2/models/no_such_model/stats", "/v2/models/tiny_mlp/versions/7/stats",
                                  "/v2/models/broken_mlp/stats"])
def test_statistics_of_a_model_or_version_not_served_are_a_400_as_on_triton(server: harness.ThreadedServer,
                                                                          path: str) -> None:
    # Triton 2.51: 400 "requested model 'm' is not available" / "requested model version is not available for
    # model 'm'" (gRPC: INVALID_ARGUMENT), where metadata and infer answer 404
    status, reply = get(server, path)
    assert status == 400, reply
    assert "not available" in orjson.loads(reply)["error"]
    assert get(server, path.removesuffix("/stats"))[0] in (404, 503)  # 503: the model that failed to load


def test_a_json_body_that_starts_with_a_utf8_byte_order_mark_is_read(server: harness.ThreadedServer) -> None:
    # Triton 2.51 reads it (Windows tools write one before a saved JSON file: curl -d @request.json)
    body = b"\xef\xbb\xbf" + orjson.dumps({"inputs": [JSON_INPUT]})
    status, _, reply = post(server, "/v2/models/id_fp32/infer", body)
    assert status == 200, reply
    assert orjson.loads(reply)["outputs"][0]["data"] == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("path", ["/v2/models/no_such_model/ready", "/v2/models/tiny_mlp/versions/7/ready",
                                  "/v2/models/broken_mlp/ready"])
def test_a_model_that_is_not_ready_answers_400_with_an_error_as_on_triton(server: harness.ThreadedServer,
                                                                        path: str) -> None:
    # Triton 2.51: 400 {"error":"Model version not ready"} (its server readiness, /v2/health/ready, has no body)
    status, reply = get(server, path)
    assert status == 400
    assert orjson.loads(reply)["error"].startswith("Model version not ready: model ")

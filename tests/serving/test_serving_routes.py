"""Triton's routes, JSON and status codes over a real Unix socket, curl, and tritonclient over loopback TCP."""

from __future__ import annotations

import shutil
import socket
import subprocess

import numpy as np
import orjson
import pytest
import tritonclient.http as triton_http
from conftest import RunningServer

from edged.protocol import decode_response, encode_request


def test_health_routes_answer_200_with_an_empty_body(server: RunningServer) -> None:
    assert server.request("GET", "/v2/health/live")[0] == 200
    assert server.request("GET", "/v2/health/ready")[::2] == (200, b"")
    assert server.request("GET", "/v2/models/tiny_mlp/ready")[0] == 200
    assert server.request("GET", "/v2/models/tiny_mlp/versions/1/ready")[0] == 200
    assert server.request("GET", "/v2/models/tiny_mlp/versions/7/ready")[0] == 400


def test_server_and_model_metadata_have_triton_shapes(server: RunningServer) -> None:
    status, _, body = server.request("GET", "/v2")
    doc = orjson.loads(body)
    assert status == 200 and doc["name"] == "edged" and "binary_tensor_data" in doc["extensions"]
    meta = orjson.loads(server.request("GET", "/v2/models/tiny_mlp")[2])
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    assert meta["versions"] == ["1"] and meta["platform"] == "onnxruntime_onnx"
    config = orjson.loads(server.request("GET", "/v2/models/tiny_mlp/config")[2])
    assert config["max_batch_size"] == 64 and config["input"][0]["data_type"] == "TYPE_FP32"


def test_unknown_model_is_404_and_unknown_route_is_404(server: RunningServer) -> None:
    status, headers, body = server.request("GET", "/v2/models/nope")
    assert status == 404 and "nope" in orjson.loads(body)["error"]
    assert headers["content-type"] == "application/json"
    assert server.request("GET", "/v3/whatever")[0] == 404


def test_wrong_method_is_405(server: RunningServer) -> None:
    status, _, body = server.request("GET", "/v2/models/tiny_mlp/infer")
    assert status == 405 and "POST" in orjson.loads(body)["error"]


def test_head_is_answered_where_get_is_without_a_body_and_keep_alive_goes_on(server: RunningServer) -> None:
    """RFC 9110 9.3.2: HEAD wherever GET. A review got 405 for HEAD /v2/health/live, sent with a body, which a
    keep-alive client reads as the start of its next response."""
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(str(server.socket_path))
        conn.sendall(b"HEAD /v2/models/tiny_mlp HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"HEAD /v2/models/tiny_mlp/infer HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while data.count(b"HTTP/1.1 ") < 3 or not data.endswith(b"\r\n\r\n"):
            chunk = conn.recv(65536)
            assert chunk, data
            data += chunk
    heads = [part for part in data.split(b"\r\n\r\n") if part]
    assert [h.split(b"\r\n")[0] for h in heads] == [b"HTTP/1.1 200 OK", b"HTTP/1.1 405 Method Not Allowed",
                                                      b"HTTP/1.1 200 OK"], data
    get = server.request("GET", "/v2/models/tiny_mlp")
    assert f"content-length: {len(get[2])}".encode() in heads[0].lower()  # the GET's length, no body
    assert b"allow: POST" in heads[1]
    assert server.request("POST", "/v2/health/live")[1]["allow"] == "GET, HEAD"


@pytest.mark.parametrize("path", ["/v2/models/..", "/v2/models/a%2Fb/ready", "/v2/models/%00x",
                                  "/v2/models/.hidden", "/v2/models/tiny_mlp/versions/..%2F1",
                                  "/v2/repository/models/..%2F..%2Fetc/load", "/v2/models/%ff%fe"])
def test_path_tricks_in_model_names_are_400(server: RunningServer, path: str) -> None:
    method = "POST" if path.endswith("load") else "GET"
    status, _, body = server.request(method, path)
    assert status == 400, body
    assert orjson.loads(body)["error"]


def test_infer_binary_extension_round_trip(server: RunningServer) -> None:
    x = np.random.default_rng(1).random((3, 64), np.float32)
    body, header_length = encode_request({"input": x})
    status, headers, reply = server.request("POST", "/v2/models/tiny_mlp/infer", body,
                                            {"Inference-Header-Content-Length": str(header_length)})
    assert status == 200 and headers["content-type"] == "application/octet-stream"
    doc, outputs = decode_response(reply, int(headers["inference-header-content-length"]))
    assert doc["model_name"] == "tiny_mlp" and outputs["output"].shape == (3, 10)


def test_infer_json_answers_json_with_the_request_id(server: RunningServer) -> None:
    request = {"id": "r-1", "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64],
                                        "data": [0.5] * 64}]}
    status, headers, reply = server.request("POST", "/v2/models/tiny_mlp/versions/1/infer", orjson.dumps(request))
    doc = orjson.loads(reply)
    assert status == 200 and headers["content-type"] == "application/json"
    assert "inference-header-content-length" not in headers
    assert doc["id"] == "r-1" and len(doc["outputs"][0]["data"]) == 10


def test_statistics_count_inferences(server: RunningServer) -> None:
    before = orjson.loads(server.request("GET", "/v2/models/tiny_mlp/stats")[2])["model_stats"][0]
    body, header_length = encode_request({"input": np.zeros((1, 64), np.float32)})
    server.request("POST", "/v2/models/tiny_mlp/infer", body, {"Inference-Header-Content-Length": str(header_length)})
    after = orjson.loads(server.request("GET", "/v2/models/tiny_mlp/versions/1/stats")[2])["model_stats"][0]
    assert after["inference_stats"]["success"]["count"] == before["inference_stats"]["success"]["count"] + 1
    every = orjson.loads(server.request("GET", "/v2/models/stats")[2])["model_stats"]
    assert {s["name"] for s in every} == {"tiny_mlp", "tiny_strict"}


def test_repository_index_and_unload_then_load(server: RunningServer) -> None:
    index = orjson.loads(server.request("POST", "/v2/repository/index")[2])
    assert {"name": "tiny_strict", "version": "1", "state": "READY", "reason": ""} in index
    assert server.request("POST", "/v2/repository/models/tiny_strict/unload")[0] == 200
    assert server.request("GET", "/v2/models/tiny_strict/ready")[0] == 400
    ready = orjson.loads(server.request("POST", "/v2/repository/index", b'{"ready": true}')[2])
    assert all(entry["name"] != "tiny_strict" for entry in ready)
    config = orjson.loads(server.request("GET", "/v2/models/tiny_mlp/config")[2])
    config["name"] = "tiny_strict"
    config["parameters"] = {"reject_nonfinite_inputs": {"string_value": "true"}}
    load = orjson.dumps({"parameters": {"config": orjson.dumps(config).decode()}})
    status, _, body = server.request("POST", "/v2/repository/models/tiny_strict/load", load)
    assert status == 200, body
    assert server.request("GET", "/v2/models/tiny_strict/ready")[0] == 200


def test_a_load_override_takes_int64_fields_as_strings_as_protobuf_json_writes_them(server: RunningServer) -> None:
    config = orjson.loads(server.request("GET", "/v2/models/tiny_mlp/config")[2])
    config["name"] = "tiny_strict"
    config["parameters"] = {"reject_nonfinite_inputs": {"string_value": "true"}}
    for tensor in (*config["input"], *config["output"]):
        tensor["dims"] = [str(d) for d in tensor["dims"]]  # MessageToJson's form of int64; before: a 400
    config["version_policy"] = {"specific": {"versions": ["1"]}}
    load = orjson.dumps({"parameters": {"config": orjson.dumps(config).decode()}})
    status, _, body = server.request("POST", "/v2/repository/models/tiny_strict/load", load)
    assert status == 200, body
    served = orjson.loads(server.request("GET", "/v2/models/tiny_strict/config")[2])
    assert served["input"][0]["dims"] == [int(d) for d in config["input"][0]["dims"]]  # numbers, as Triton answers
    config["input"][0]["dims"] = ["sixty-four"]
    load = orjson.dumps({"parameters": {"config": orjson.dumps(config).decode()}})
    status, _, body = server.request("POST", "/v2/repository/models/tiny_strict/load", load)
    assert status == 400
    assert orjson.loads(body)["error"] == ("load request for model tiny_strict: field 'input[0].dims' expects an "
                                           'integer, found string "sixty-four"')  # the prefix once


def test_load_with_a_bad_config_is_400(server: RunningServer) -> None:
    status, _, body = server.request("POST", "/v2/repository/models/tiny_mlp/load",
                                     b'{"parameters": {"config": "{not json"}}')
    assert status == 400 and "not valid JSON" in orjson.loads(body)["error"]
    status, _, body = server.request("POST", "/v2/repository/models/ghost/load")
    assert status in (400, 404) and orjson.loads(body)["error"]


def test_metrics_use_triton_names_and_the_edged_histogram(server: RunningServer) -> None:
    status, headers, body = server.request("GET", "/metrics")
    text = body.decode()
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    for name in ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
                 "nv_inference_exec_count", "nv_inference_queue_duration_us",
                 "nv_inference_compute_infer_duration_us"):
        assert f'{name}{{model="tiny_mlp",version="1"}}' in text
    assert 'edged_request_duration_seconds_bucket{model="tiny_mlp",version="1",le="+Inf"}' in text
    assert "# TYPE edged_access_denied_total counter" in text


def test_status_telemetry_and_openapi(server: RunningServer) -> None:
    status = orjson.loads(server.request("GET", "/v2/edged/status")[2])
    assert status["ready"] is True and status["mqtt"] == {"connected": False}
    assert {m["name"] for m in status["models"]} >= {"tiny_mlp"} and status["listeners"]
    code, _, body = server.request("GET", "/v2/edged/telemetry")
    assert code == 404 and "telemetry" in orjson.loads(body)["error"]
    spec = orjson.loads(server.request("GET", "/v2/edged/openapi.json")[2])
    assert spec["openapi"].startswith("3.") and "/v2/models/{model_name}/infer" in spec["paths"]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_over_the_unix_socket(server: RunningServer) -> None:
    request = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [1] * 64}]})
    out = subprocess.run(["curl", "-sS", "--unix-socket", str(server.socket_path), "-H", "Expect:",
                          "--data-binary", "@-", "http://localhost/v2/models/tiny_mlp/infer"],
                         input=request, capture_output=True, check=True, timeout=10).stdout
    assert orjson.loads(out)["outputs"][0]["shape"] == [1, 10]


def test_tritonclient_over_loopback_tcp(server: RunningServer) -> None:
    client = triton_http.InferenceServerClient(f"127.0.0.1:{server.tcp_port}")
    try:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("tiny_mlp")
        assert client.get_model_metadata("tiny_mlp")["name"] == "tiny_mlp"
        assert client.get_model_config("tiny_mlp")["max_batch_size"] == 64
        x = np.ones((2, 64), np.float32)
        for binary in (True, False):
            tensor = triton_http.InferInput("input", [2, 64], "FP32")
            tensor.set_data_from_numpy(x, binary_data=binary)
            wanted = [triton_http.InferRequestedOutput("output", binary_data=binary)]
            result = client.infer("tiny_mlp", [tensor], outputs=wanted)
            assert result.as_numpy("output").shape == (2, 10)
        stats = client.get_inference_statistics("tiny_mlp")
        assert stats["model_stats"][0]["inference_count"] >= 4
        with pytest.raises(Exception, match="ghost"):
            client.get_model_metadata("ghost")
    finally:
        client.close()


_X = np.zeros((1, 64), np.float32)
_BINARY_BODY, _BINARY_HEADER = encode_request({"input": _X})
# One request per Triton extension that proves its routes exist here (issue #14: system_shared_memory was
# advertised while /v2/systemsharedmemory answered 404). Extensions without routes of their own probe the route
# that carries them.
_EXTENSION_PROBES: dict[str, tuple[str, str, bytes, dict[str, str]]] = {
    "classification": ("POST", "/v2/models/tiny_mlp/infer",
                       orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64],
                                                 "data": [0.0] * 64}],
                                     "outputs": [{"name": "output", "parameters": {"classification": 2}}]}), {}),
    "model_repository": ("POST", "/v2/repository/index", b"{}", {}),
    "model_configuration": ("GET", "/v2/models/tiny_mlp/config", b"", {}),
    "binary_tensor_data": ("POST", "/v2/models/tiny_mlp/infer", _BINARY_BODY,
                           {"Inference-Header-Content-Length": str(_BINARY_HEADER)}),
    "parameters": ("POST", "/v2/models/tiny_mlp/infer",
                   orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64],
                                             "data": [0.0] * 64}], "parameters": {"priority": 1}}), {}),
    "statistics": ("GET", "/v2/models/tiny_mlp/stats", b"", {}),
    "schedule_policy": ("GET", "/v2/models/tiny_mlp/config", b"", {}),
    "system_shared_memory": ("GET", "/v2/systemsharedmemory/status", b"", {}),
    "cuda_shared_memory": ("GET", "/v2/cudasharedmemory/status", b"", {}),
    # advertised only while a generative model is ready (tests/genai/test_generate.py serves one)
    "generate": ("POST", "/v2/models/tiny_llama/generate", b'{"text_input": "hi"}', {}),
}


def test_every_advertised_extension_has_working_routes(server: RunningServer) -> None:
    extensions = orjson.loads(server.request("GET", "/v2")[2])["extensions"]
    unprobed = sorted(set(extensions) - set(_EXTENSION_PROBES))
    assert not unprobed, f"add a probe for the advertised extensions {unprobed}"
    for name in extensions:
        method, path, body, headers = _EXTENSION_PROBES[name]
        status, _, reply = server.request(method, path, body or None, headers)
        assert status == 200, (name, status, reply[:200])


@pytest.mark.parametrize(("path", "feature"), [("/v2/trace/setting", "tracing"),
                                               ("/v2/models/tiny_mlp/trace/setting", "tracing"),
                                               ("/v2/logging", "dynamic logging")])
def test_trace_and_log_settings_answer_as_a_triton_without_them(server: RunningServer, path: str,
                                                                 feature: str) -> None:
    for method, body in (("GET", None), ("POST", b'{"log_info": true}')):
        status, _, answer = server.request(method, path, body)
        assert status == 503, answer
        assert orjson.loads(answer)["error"].startswith(f"the server does not support {feature}: ")
    status, headers, _ = server.request("DELETE", path)
    assert status == 405 and headers["allow"] == "GET, POST, HEAD"


def test_tritonclient_settings_calls_say_the_feature_is_absent(server: RunningServer) -> None:
    client = triton_http.InferenceServerClient(f"127.0.0.1:{server.tcp_port}")
    try:
        for call in (client.get_trace_settings, client.get_log_settings, lambda: client.update_log_settings({})):
            with pytest.raises(triton_http.InferenceServerException, match="the server does not support"):
                call()
    finally:
        client.close()

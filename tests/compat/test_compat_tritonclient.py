"""Triton's own Python client (tritonclient.http) against edged's loopback TCP listener: the same calls an
application written for Triton makes must work unchanged."""

from __future__ import annotations

import json

import numpy as np
import pytest

httpclient = pytest.importorskip("tritonclient.http")
from conftest import REPOSITORY_KEY  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from edged.client import EdgedClient  # noqa: E402


@pytest.fixture
def triton(tcp_server):  # type: ignore[no-untyped-def]
    client = httpclient.InferenceServerClient(f"127.0.0.1:{tcp_server.port}")
    yield client
    client.close()


def test_server_health_and_metadata(triton) -> None:  # type: ignore[no-untyped-def]
    assert triton.is_server_live() and triton.is_server_ready()
    meta = triton.get_server_metadata()
    assert meta["name"] == "edged" and "binary_tensor_data" in meta["extensions"]


def test_model_metadata_config_and_readiness(triton) -> None:  # type: ignore[no-untyped-def]
    meta = triton.get_model_metadata("tiny_mlp")
    assert meta["inputs"][0] == {"name": "input", "datatype": "FP32", "shape": [-1, 64]}
    assert meta["outputs"][0]["name"] == "output"
    config = triton.get_model_config("tiny_mlp")
    assert config["max_batch_size"] == 64 and config["input"][0]["dims"] == [64]
    assert triton.is_model_ready("tiny_mlp") and triton.is_model_ready("tiny_mlp", "1")
    assert not triton.is_model_ready("no_such_model")


@pytest.mark.parametrize(("binary_in", "binary_out"), [(True, True), (False, False), (True, False), (False, True)])
def test_inference_json_and_binary(triton, tcp_server, binary_in: bool, binary_out: bool) -> None:  # type: ignore[no-untyped-def]
    x = np.random.default_rng(5).standard_normal((4, 64)).astype(np.float32)
    tensor = httpclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary_in)
    wanted = httpclient.InferRequestedOutput("output", binary_data=binary_out)
    result = triton.infer("tiny_mlp", [tensor], outputs=[wanted], request_id="t1")
    out = result.as_numpy("output")
    with EdgedClient(tcp_server.socket_path) as client:
        expected = client.infer("tiny_mlp", {"input": x}).as_numpy("output")
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    response = result.get_response()
    assert response["model_name"] == "tiny_mlp" and response["id"] == "t1"


def test_errors_raise_inference_server_exception_with_the_message(triton) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InferenceServerException, match="no_such_model"):
        triton.get_model_metadata("no_such_model")
    tensor = httpclient.InferInput("input", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 3), np.float32))
    with pytest.raises(InferenceServerException, match="input"):
        triton.infer("tiny_mlp", [tensor])


def test_statistics(triton) -> None:  # type: ignore[no-untyped-def]
    tensor = httpclient.InferInput("input", [1, 64], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 64), np.float32))
    triton.infer("tiny_mlp", [tensor])
    stats = triton.get_inference_statistics("tiny_mlp")["model_stats"][0]
    assert stats["name"] == "tiny_mlp" and stats["version"] == "1"
    assert stats["inference_count"] >= 1 and stats["inference_stats"]["success"]["count"] >= 1
    assert stats["inference_stats"]["compute_infer"]["ns"] > 0
    everything = triton.get_inference_statistics()["model_stats"]
    assert {s["name"] for s in everything} >= {"tiny_mlp", "digits_onnx"}


def test_repository_index_load_and_unload_in_explicit_mode(explicit_tcp_server) -> None:  # type: ignore[no-untyped-def]
    triton = httpclient.InferenceServerClient(f"127.0.0.1:{explicit_tcp_server.port}")
    try:
        key = REPOSITORY_KEY  # the repository API is restricted over TCP, as with Triton's --http-restricted-api
        index = {m["name"]: m for m in triton.get_model_repository_index(headers=key)}
        assert index["tiny_mlp"]["state"] == "READY" and index["digits_onnx"].get("state") != "READY"
        triton.load_model("digits_onnx", headers=key)
        assert triton.is_model_ready("digits_onnx")
        config = triton.get_model_config("tiny_mlp")
        # the preferred batch size the config came back with (64) must shrink with max_batch_size: Triton refuses
        # a preferred size past max_batch_size, and so does edged now
        smaller = {**config, "max_batch_size": 4,
                   "dynamic_batching": {**config.get("dynamic_batching", {}), "preferred_batch_size": [4]}}
        triton.load_model("tiny_mlp", config=json.dumps(smaller), headers=key)
        assert triton.get_model_config("tiny_mlp")["max_batch_size"] == 4
        triton.unload_model("digits_onnx", headers=key)
        assert not triton.is_model_ready("digits_onnx")
        with pytest.raises(InferenceServerException, match="ghost"):
            triton.load_model("ghost", headers=key)
        # Triton's files override (model files in the request) is refused by name; the model keeps serving
        with pytest.raises(InferenceServerException, match=r"unsupported parameters.*file:1/model\.onnx") as refused:
            triton.load_model("tiny_mlp", config=json.dumps(config), files={"file:1/model.onnx": b"\0" * 16},
                              headers=key)
        assert refused.value.status() == "400"
        assert triton.is_model_ready("tiny_mlp")
    finally:
        triton.close()


def test_a_failed_load_raises_with_triton_s_status_and_wording(explicit_tcp_server) -> None:  # type: ignore[no-untyped-def]
    # a model folder whose model file is corrupt: Triton answers its load with 400 "load failed for model ..."
    folder = explicit_tcp_server.repository / "corrupt_mlp"
    (folder / "1").mkdir(parents=True)
    config = (explicit_tcp_server.repository / "tiny_mlp" / "config.pbtxt").read_text()
    (folder / "config.pbtxt").write_text(config.replace('"tiny_mlp"', '"corrupt_mlp"'))
    (folder / "1" / "model.onnx").write_bytes(b"\x00not an onnx file" * 8)
    triton = httpclient.InferenceServerClient(f"127.0.0.1:{explicit_tcp_server.port}")
    try:
        with pytest.raises(InferenceServerException) as failed:
            triton.load_model("corrupt_mlp", headers=REPOSITORY_KEY)
        assert failed.value.status() == "400"
        assert failed.value.message().startswith("load failed for model 'corrupt_mlp': "), failed.value.message()
        assert "Protobuf parsing failed" in failed.value.message()
        assert not triton.is_model_ready("corrupt_mlp")
        assert triton.is_model_ready("tiny_mlp")
    finally:
        triton.close()


def test_unloading_a_model_that_is_not_loaded_succeeds_as_on_triton(explicit_tcp_server) -> None:  # type: ignore[no-untyped-def]
    # Triton 2.51 answers 200 (empty body) to an unload of a model not loaded, in the repository or not
    triton = httpclient.InferenceServerClient(f"127.0.0.1:{explicit_tcp_server.port}")
    try:
        triton.load_model("digits_onnx", headers=REPOSITORY_KEY)
        triton.unload_model("digits_onnx", headers=REPOSITORY_KEY)
        triton.unload_model("digits_onnx", headers=REPOSITORY_KEY)  # again: already unloaded
        triton.unload_model("never_in_the_repository", headers=REPOSITORY_KEY)
        assert not triton.is_model_ready("digits_onnx") and triton.is_model_ready("tiny_mlp")
    finally:
        triton.close()


def test_an_unloaded_model_keeps_its_version_numbers_in_the_index(explicit_tcp_server) -> None:  # type: ignore[no-untyped-def]
    # Triton 2.51 lists an unloaded model per version it had: {"name": "m", "version": "1", "state": "UNAVAILABLE",
    # "reason": "unloaded"}; the fields edged writes beside Triton's (an empty "reason") are left out of the check
    triton = httpclient.InferenceServerClient(f"127.0.0.1:{explicit_tcp_server.port}")
    try:
        triton.load_model("digits_onnx", headers=REPOSITORY_KEY)
        triton.unload_model("digits_onnx", headers=REPOSITORY_KEY)
        entries = [m for m in triton.get_model_repository_index(headers=REPOSITORY_KEY) if m["name"] == "digits_onnx"]
        assert entries == [{"name": "digits_onnx", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}]
        tiny = [m for m in triton.get_model_repository_index(headers=REPOSITORY_KEY) if m["name"] == "tiny_mlp"]
        assert [(m["version"], m["state"]) for m in tiny] == [("1", "READY")]
    finally:
        triton.close()

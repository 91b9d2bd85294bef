"""A header kept by the header cache and a default version taken from the engine's cached choice never outlive
the model they were used for: over one keep-alive connection repeating one binary header, a new version, an
unload and a load again each change the answer as they change it for a request seen for the first time."""

from __future__ import annotations

import http.client
import shutil
from pathlib import Path

import numpy as np
from conftest import RunningServer, UnixHTTPConnection
from modelgen import add_model, mlp_reference, mlp_weights

from edged.config import ModelsConfig, ServerConfig
from edged.protocol import decode_response, encode_request

_CONFIG = 'name: "mlp"\nbackend: "onnxruntime"\nmax_batch_size: 8\nversion_policy: { latest: { num_versions: 1 } }'


def _post(conn: UnixHTTPConnection, x: np.ndarray) -> tuple[int, dict[str, object], dict[str, np.ndarray]]:
    body, header_length = encode_request({"input": x})
    assert header_length is not None
    conn.request("POST", "/v2/models/mlp/infer", body=body,
                 headers={"inference-header-content-length": str(header_length),
                          "content-type": "application/octet-stream"})
    response = conn.getresponse()
    data = response.read()
    length = response.getheader("inference-header-content-length")
    if response.status != 200:
        return response.status, {"error": data.decode()}, {}
    doc, outputs = decode_response(data, int(length) if length else None)
    return response.status, doc, outputs


def test_a_repeated_header_is_answered_by_the_version_served_now_after_reloads_and_unloads(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    weights = {1: mlp_weights(seed=1), 2: mlp_weights(seed=2)}
    add_model(repo, "mlp", _CONFIG, {1: weights[1]})
    running = RunningServer(repo, ServerConfig(http_port=0), tmp_path / "edged.sock",
                            ModelsConfig(control_mode="explicit", startup_models=("mlp",), warmup=False))
    rng = np.random.default_rng(5)
    conn = running.connection()
    try:
        for _ in range(3):  # the first is decoded in full and its header kept; the others come from the cache
            x = rng.random((1, 64), np.float32)
            status, doc, outputs = _post(conn, x)
            assert status == 200 and doc["model_version"] == "1"
            np.testing.assert_allclose(outputs["output"], mlp_reference(weights[1], x), atol=1e-5)
        add_model(repo, "mlp", None, {2: weights[2]})
        running.service.load_model("mlp")  # the default moves to version 2; version 1 is unloaded
        for _ in range(2):
            x = rng.random((1, 64), np.float32)
            status, doc, outputs = _post(conn, x)
            assert status == 200 and doc["model_version"] == "2"
            np.testing.assert_allclose(outputs["output"], mlp_reference(weights[2], x), atol=1e-5)
        running.service.unload_model("mlp")
        status, doc, _ = _post(conn, rng.random((1, 64), np.float32))
        assert status in (400, 404, 503) and "mlp" in str(doc["error"]), (status, doc)
        shutil.rmtree(repo / "mlp" / "2")
        running.service.load_model("mlp")  # version 1 alone again
        x = rng.random((1, 64), np.float32)
        status, doc, outputs = _post(conn, x)
        assert status == 200 and doc["model_version"] == "1"
        np.testing.assert_allclose(outputs["output"], mlp_reference(weights[1], x), atol=1e-5)
    except http.client.HTTPException as e:
        raise AssertionError(f"the connection broke: {e!r}") from e
    finally:
        conn.close()
        running.stop()

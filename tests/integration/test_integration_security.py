"""The reproductions of issue #13 §1 against the real daemon (``edged serve --http-port``): over loopback TCP
nobody may load or unload models by default, and a load override naming a file outside the model folder is
refused instead of serving that file's lines as classification labels."""

from __future__ import annotations

import http.client
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest
from integration.edged_daemon import DaemonProcess, start_daemon
from modelgen import BUNDLED_MODELS

from edged.client import InvalidInputError

CONFIG = ('[telemetry]\nsource = "off"\n\n[models]\ncontrol_mode = "explicit"\n'
          'startup_models = ["digits_onnx"]\n')


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, int]]:
    workdir = tmp_path_factory.mktemp("security")
    shutil.copytree(BUNDLED_MODELS, workdir / "models")
    port = _free_port()
    running = start_daemon(workdir, config=CONFIG, args=["--model-repository", str(workdir / "models"),
                                                         "--http-port", str(port)])
    yield running, port
    running.stop()


def _tcp(port: int, method: str, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_loopback_tcp_callers_may_not_load_or_unload_by_default(daemon: tuple[DaemonProcess, int]) -> None:
    running, port = daemon
    for action in ("load", "unload"):
        status, body = _tcp(port, "POST", f"/v2/repository/models/digits_onnx/{action}")
        assert status == 403
        assert "server.tcp_restricted.model-repository" in orjson.loads(body)["error"]
    assert _tcp(port, "POST", "/v2/repository/index")[0] == 200
    assert running.client().model_ready("digits_onnx")


def test_a_label_filename_outside_the_model_folder_never_reaches_classification_results(
        daemon: tuple[DaemonProcess, int]) -> None:
    client = daemon[0].client()
    config = client.model_config("digits_onnx")
    config["output"][0]["label_filename"] = "/etc/passwd"
    with pytest.raises(InvalidInputError, match="'/etc/passwd' is an absolute path"):
        client.load("digits_onnx", config)
    request = orjson.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                                        "data": np.full(64, 0.5).tolist()}],
                            "outputs": [{"name": "output", "parameters": {"classification": 10}}]})
    conn = http.client.HTTPConnection("127.0.0.1", daemon[1], timeout=30)
    try:
        conn.request("POST", "/v2/models/digits_onnx/infer", request)
        labels = orjson.loads(conn.getresponse().read())["outputs"][0]["data"]
    finally:
        conn.close()
    assert sorted(entry.split(":", 2)[2] for entry in labels) == [str(digit) for digit in range(10)]


def test_a_default_model_filename_outside_the_repository_is_refused(daemon: tuple[DaemonProcess, int],
                                                                    tmp_path: Path) -> None:
    outside = tmp_path / "model.onnx"
    outside.write_bytes(b"not read")
    client = daemon[0].client()
    config = client.model_config("digits_onnx")
    config["default_model_filename"] = str(outside)
    with pytest.raises(InvalidInputError, match=r"default_model_filename .* is an absolute path"):
        client.load("digits_onnx", config)
    assert client.model_ready("digits_onnx")

"""Files a model config names stay inside the model folder, through a load request's ``config`` override."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import MODELS, RunningServer

from edged.config import ModelsConfig, ServerConfig
from edged.repository import MAX_CONFIG_BYTES, MAX_LABEL_BYTES


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("confine")
    repo = tmp / "repo"
    shutil.copytree(MODELS / "digits_onnx", repo / "digits_onnx")
    shutil.copytree(MODELS / "digits_onnx", repo / "other")  # a second model folder: outside digits_onnx's
    (repo / "other" / "config.pbtxt").write_text(
        (repo / "other" / "config.pbtxt").read_text().replace('"digits_onnx"', '"other"'))
    (tmp / "secret.txt").write_text("secret-line-1\nsecret-line-2\n")
    folder = repo / "digits_onnx"
    (folder / "alias.txt").symlink_to("labels.txt")  # within the folder: allowed
    (folder / "escape.txt").symlink_to(tmp / "secret.txt")  # leading out: refused
    (folder / "1" / "escape.onnx").symlink_to(repo / "other" / "1" / "model.onnx")
    os.mkfifo(folder / "fifo.txt")
    models = ModelsConfig(control_mode="explicit", startup_models=("digits_onnx",))
    running = RunningServer(repo, ServerConfig(), tmp / "edged.sock", models)
    yield running
    running.stop()


def _config(served: RunningServer) -> dict[str, Any]:
    status, _, body = served.request("GET", "/v2/models/digits_onnx/config")
    assert status == 200, body
    config: dict[str, Any] = orjson.loads(body)
    return config


def _load(served: RunningServer, config: dict[str, Any]) -> tuple[int, str]:
    body = orjson.dumps({"parameters": {"config": orjson.dumps(config).decode()}})
    status, _, reply = served.request("POST", "/v2/repository/models/digits_onnx/load", body)
    return status, orjson.loads(reply)["error"] if reply else ""


def _with_labels(served: RunningServer, label_filename: str) -> tuple[int, str]:
    config = _config(served)
    config["output"][0]["label_filename"] = label_filename
    return _load(served, config)


def _classify(served: RunningServer) -> list[str]:
    request = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}],
               "outputs": [{"name": "output", "parameters": {"classification": 10}}]}
    status, _, body = served.request("POST", "/v2/models/digits_onnx/infer", orjson.dumps(request))
    assert status == 200, body
    return [entry.split(":", 2)[2] for entry in orjson.loads(body)["outputs"][0]["data"]]


def test_an_absolute_label_filename_is_refused_and_never_reaches_results(served: RunningServer) -> None:
    status, error = _with_labels(served, "/etc/passwd")
    assert status == 400
    assert "label_filename of output 'output' '/etc/passwd' is an absolute path" in error
    assert not any(label.startswith("root:") for label in _classify(served))


def test_a_label_filename_escaping_with_dot_dot_is_refused(served: RunningServer) -> None:
    status, error = _with_labels(served, "../../secret.txt")
    assert status == 400 and "'../../secret.txt' leads outside the model folder" in error
    assert "secret-line-1" not in _classify(served)


def test_a_symlink_leading_out_of_the_model_folder_is_refused(served: RunningServer) -> None:
    status, error = _with_labels(served, "escape.txt")
    assert status == 400 and "'escape.txt' leads outside the model folder" in error
    assert "secret-line-1" not in _classify(served)


def test_a_label_file_that_is_not_a_regular_file_is_refused(served: RunningServer) -> None:
    status, error = _with_labels(served, "fifo.txt")
    assert status == 400 and "'fifo.txt' in the model folder" in error and "not a regular file" in error


def test_a_symlink_within_the_model_folder_is_allowed(served: RunningServer) -> None:
    status, error = _with_labels(served, "alias.txt")
    assert status == 200, error
    assert sorted(_classify(served)) == [str(digit) for digit in range(10)]  # labels.txt holds the digits


def test_a_default_model_filename_outside_the_model_folder_is_refused(served: RunningServer) -> None:
    config = _config(served)
    for name in (str(served.service.repository / "other" / "1" / "model.onnx"), "../../other/1/model.onnx",
                 "escape.onnx"):
        config["default_model_filename"] = name
        status, error = _load(served, config)
        assert status == 400, (name, error)
        assert f"default_model_filename {name!r}" in error
        assert "absolute path" in error or "leads outside the model folder" in error


def test_a_warmup_input_data_file_outside_the_model_folder_is_refused(served: RunningServer) -> None:
    config = _config(served)
    config["model_warmup"] = [{"name": "w", "batch_size": 1, "count": 1, "inputs": {
        "input": {"data_type": "TYPE_FP32", "dims": [64], "input_data_file": "../../../secret.txt"}}}]
    status, error = _load(served, config)
    assert status == 400
    assert "input_data_file of warm-up 'w' input 'input' '../../../secret.txt' leads outside" in error


def test_the_model_still_serves_after_refused_loads(served: RunningServer) -> None:
    assert _with_labels(served, "labels.txt")[0] == 200
    assert served.request("GET", "/v2/models/digits_onnx/ready")[0] == 200
    assert sorted(_classify(served)) == [str(digit) for digit in range(10)]


def test_a_tensorrt_engine_cache_path_outside_the_model_folder_is_refused(served: RunningServer) -> None:
    config = _config(served)
    for name, problem in (("/var/tmp/trt", "is an absolute path"), ("../../trt", "leads outside the model folder"),
                          ("labels.txt", "is not a folder")):
        config["parameters"] = {"trt_engine_cache_path": {"string_value": name}}
        status, error = _load(served, config)
        assert status == 400, (name, error)
        assert f"parameter trt_engine_cache_path {name!r}" in error and problem in error
    config["parameters"] = {"trt_engine_cache_path": {"string_value": "trt_cache"}}
    assert _load(served, config)[0] == 200  # inside the folder, created by the runtime when first used


def test_a_tensorrt_engine_cache_prefix_that_is_a_path_is_refused(served: RunningServer) -> None:
    """ORT joins the prefix to the cache folder: '../../x' put the engine files outside the model folder."""
    config = _config(served)
    for prefix in ("../../../../tmp/edged-engine", "sub/x", "a\\..\\b", "/abs"):
        config["optimization"] = {"execution_accelerators": {"gpu_execution_accelerator": [
            {"name": "tensorrt", "parameters": {"trt_engine_cache_prefix": prefix}}]}}
        status, error = _load(served, config)
        assert status == 400, (prefix, error)
        assert f"trt_engine_cache_prefix {prefix!r}" in error and "one file name prefix" in error, error
    config["optimization"] = {"execution_accelerators": {"gpu_execution_accelerator": [
        {"name": "tensorrt", "parameters": {"trt_engine_cache_prefix": "cam0_v2"}}]}}
    assert _load(served, config)[0] == 200


def test_a_label_file_larger_than_the_limit_is_refused_at_load(served: RunningServer) -> None:
    """A label file is read whole, on the first classification request: a load naming the model file itself, or
    any large file of the folder, as labels held that memory (and the loop while it read)."""
    folder = Path(served.service.repository) / "digits_onnx"
    (folder / "big.txt").write_bytes(b"x\n" * (MAX_LABEL_BYTES // 2 + 1))
    try:
        status, error = _with_labels(served, "big.txt")
        assert status == 400, error
        assert "label_filename of output 'output' 'big.txt'" in error and f"limit of {MAX_LABEL_BYTES} bytes" in error
        assert _with_labels(served, "labels.txt")[0] == 200
    finally:
        (folder / "big.txt").unlink()


def test_a_config_override_larger_than_a_config_pbtxt_may_be_is_refused_unparsed(served: RunningServer) -> None:
    """The override is parsed where the request is answered: a 29 MB one held every other request 14 s."""
    config = _config(served)
    config["parameters"] = {f"k{i}": {"string_value": "v" * 40} for i in range(MAX_CONFIG_BYTES // 40 + 1)}
    status, error = _load(served, config)
    assert status == 400, error
    assert "parameters.config" in error and f"the limit of {MAX_CONFIG_BYTES} bytes" in error, error
    config["parameters"] = {f"k{i}": {"string_value": "v" * 10} for i in range(100)}
    assert _load(served, config)[0] == 200

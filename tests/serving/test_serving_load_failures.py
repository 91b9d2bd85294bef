"""A load that fails because of the model is a 400 worded as Triton words it ("load failed for model 'm': why"),
over raw HTTP on the Unix socket; a load that fails for lack of memory stays a 503; HTTP's and gRPC's status
tables agree. Real onnxruntime and TorchScript models on the CPU."""

from __future__ import annotations

import inspect
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest
import torch
from conftest import MODELS, RunningServer

from edged import errors
from edged.config import ModelsConfig, ServerConfig
from edged.grpcapi._status import Status, code_for
from edged.serving._response import status_for

TORCH_CONFIG = """name: "hungry"
backend: "pytorch"
max_batch_size: 8
input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ -1 ] } ]
model_warmup [ { name: "w", batch_size: 1, count: 1,
                 inputs { key: "x", value: { data_type: TYPE_FP32, dims: [ 4 ], input_data_file: "x.raw" } } } ]
"""


class Hungry(torch.nn.Module):
    """Doubles its input; asks for a petabyte for values below -100 (torch: "can't allocate memory")."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x < -100).any()):
            return torch.empty([1 << 50], dtype=torch.uint8)[:4].float().reshape(1, 4)
        return x * 2


def _onnx_model(repo: Path, name: str, model: bytes | None) -> None:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    config = (MODELS / "tiny_mlp" / "config.pbtxt").read_text().replace('"tiny_mlp"', f'"{name}"')
    (folder / "config.pbtxt").write_text(config)
    if model is not None:
        (folder / "1" / "model.onnx").write_bytes(model)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("loadfail")
    repo = tmp / "repo"
    shutil.copytree(MODELS / "tiny_mlp", repo / "tiny_mlp")
    _onnx_model(repo, "corrupt", b"\x00not an onnx file" * 8)
    _onnx_model(repo, "missing", None)  # a version folder without its model file
    _onnx_model(repo, "broken_config", (MODELS / "tiny_mlp" / "1" / "model.onnx").read_bytes())
    (repo / "broken_config" / "config.pbtxt").write_text('name: "broken_config"\nmax_batch_size: {\n')
    hungry = repo / "hungry"
    (hungry / "1").mkdir(parents=True)
    (hungry / "warmup").mkdir()
    torch.jit.script(Hungry()).save(str(hungry / "1" / "model.pt"))
    (hungry / "config.pbtxt").write_text(TORCH_CONFIG)
    (hungry / "warmup" / "x.raw").write_bytes(np.full(4, -400.0, np.float32).tobytes())  # its warm-up OOMs
    models = ModelsConfig(control_mode="explicit", startup_models=("tiny_mlp",))
    running = RunningServer(repo, ServerConfig(http_port=None), tmp / "edged.sock", models)
    yield running
    running.stop()


def _load(served: RunningServer, model: str) -> tuple[int, dict[str, str], str]:
    status, headers, body = served.request("POST", f"/v2/repository/models/{model}/load", b"")
    return status, headers, orjson.loads(body)["error"] if body else ""


@pytest.mark.parametrize(("model", "why"), [
    ("corrupt", "Protobuf parsing failed"),
    ("missing", "model.onnx"),
    ("broken_config", "config.pbtxt:3:1: expected '}'"),
])
def test_a_load_that_fails_because_of_the_model_is_a_400_saying_load_failed_and_why(
        served: RunningServer, model: str, why: str) -> None:
    status, _, error = _load(served, model)
    assert status == 400, error
    assert error.startswith(f"load failed for model '{model}': "), error
    assert why in error, error
    assert served.request("GET", f"/v2/models/{model}/ready")[0] != 200
    assert served.request("GET", "/v2/models/tiny_mlp/ready")[0] == 200  # the daemon keeps serving


def test_a_load_whose_warm_up_runs_out_of_memory_stays_a_503_out_of_memory(served: RunningServer) -> None:
    status, headers, error = _load(served, "hungry")
    assert status == 503, error
    assert headers["x-edged-error"] == "OutOfMemory"
    assert error.startswith("load failed for model 'hungry': ") and "ran out of memory" in error, error


def _families() -> list[type[errors.EdgedError]]:
    return [cls for _, cls in inspect.getmembers(errors, inspect.isclass) if issubclass(cls, errors.EdgedError)]


@pytest.mark.parametrize("family", _families(), ids=lambda cls: cls.__name__)
def test_http_and_grpc_answer_each_error_family_alike(family: type[errors.EdgedError]) -> None:
    error = family.__new__(family)  # the tables read only the class
    status, code = status_for(error), code_for(error)
    assert (status == 503) == (code is Status.UNAVAILABLE), (status, code)
    if issubclass(family, errors.ModelLoadError | errors.ConfigError) and status != 503:
        assert (status, code) == (400, Status.INVALID_ARGUMENT)

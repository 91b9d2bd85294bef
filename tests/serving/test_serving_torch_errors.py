"""PyTorch failures keep their family over the socket: a bad input is 400, the model raising is 500, running out
of memory is 503 with X-Edged-Error, with real TorchScript models on the CPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest
import torch
from conftest import RunningServer

from edged.client import EdgedClient, OutOfMemoryError, UnavailableError
from edged.config import ServerConfig

CONFIG = """name: "{name}"
backend: "pytorch"
max_batch_size: 8
input [ {{ name: "x", data_type: TYPE_FP32, dims: [ {dims} ] }} ]
output [ {{ name: "y", data_type: TYPE_FP32, dims: [ -1 ] }} ]
"""


class Guarded(torch.nn.Module):
    """Doubles its input; raises for values above 100 and asks for a petabyte for values below -100."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x > 100).any()):
            raise RuntimeError("sensor value out of range")
        if bool((x < -100).any()):
            return torch.empty([1 << 50], dtype=torch.uint8)[:4].float().reshape(1, 4)
        return x * 2


class Scale(torch.nn.Module):
    """Scales 4 features (or broadcasts 1), although its config accepts any number of them."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0, 4.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def add_torch_model(repo: Path, name: str, module: torch.nn.Module, dims: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    torch.jit.script(module).save(str(repo / name / "1" / "model.pt"))
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, dims=dims))


@pytest.fixture(scope="module")
def torch_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("torch")
    repo = tmp / "repo"
    add_torch_model(repo, "guarded", Guarded(), "4")
    add_torch_model(repo, "scale", Scale(), "-1")
    running = RunningServer(repo, ServerConfig(http_port=None), tmp / "edged.sock")
    yield running
    running.stop()


def infer(server: RunningServer, model: str, values: list[float]) -> tuple[int, dict[str, str], dict[str, object]]:
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, len(values)], "data": values}]})
    status, headers, raw = server.request("POST", f"/v2/models/{model}/infer", body,
                                          {"content-type": "application/json"})
    return status, headers, orjson.loads(raw)


def test_a_model_that_raises_at_run_time_is_a_500_inference_failure(torch_server: RunningServer) -> None:
    status, headers, doc = infer(torch_server, "guarded", [1.0, 2.0, 3.0, 400.0])
    assert status == 500
    assert headers["x-edged-error"] == "InferenceFailed"
    assert "sensor value out of range" in str(doc["error"])
    status, _, doc = infer(torch_server, "guarded", [1.0, 2.0, 3.0, 4.0])
    assert status == 200 and doc["outputs"][0]["data"] == [2.0, 4.0, 6.0, 8.0]  # type: ignore[index]


def test_running_out_of_memory_is_a_503_named_out_of_memory(torch_server: RunningServer) -> None:
    status, headers, doc = infer(torch_server, "guarded", [1.0, 2.0, 3.0, -400.0])
    assert status == 503
    assert headers["x-edged-error"] == "OutOfMemory"
    assert "can't allocate memory" in str(doc["error"])
    with EdgedClient(torch_server.socket_path) as client, pytest.raises(OutOfMemoryError) as raised:
        client.infer("guarded", {"x": np.array([[1, 2, 3, -400]], np.float32)})
    assert isinstance(raised.value, UnavailableError) and raised.value.status == 503


def test_a_shape_the_model_cannot_take_is_a_400_invalid_input(torch_server: RunningServer) -> None:
    status, headers, doc = infer(torch_server, "scale", [1.0, 2.0, 3.0, 4.0, 5.0])
    assert status == 400
    assert "x-edged-error" not in headers
    assert "torch rejected the input" in str(doc["error"]) and "must match the size" in str(doc["error"])
    assert infer(torch_server, "scale", [1.0, 1.0, 1.0, 1.0])[2]["outputs"][0]["data"] == [  # type: ignore[index]
        1.0, 2.0, 3.0, 4.0]

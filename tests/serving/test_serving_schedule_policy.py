"""The schedule_policy extension over a real Unix socket: GET /v2 advertises it, and a request's "priority" and
"timeout" parameters reach the model's queue policy (timeout_action DELAY answers late, REJECT answers 503)."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest
from conftest import RunningServer

from edged.config import ModelsConfig, ServerConfig
from edged.engine import InferRequest, InferResponse
from edged.errors import EdgedError

MLP = Path(__file__).resolve().parents[2] / "models" / "tiny_mlp" / "1" / "model.onnx"
CONFIG = """name: "{name}"
backend: "onnxruntime"
max_batch_size: 1
input [ {{ name: "input", data_type: TYPE_FP32, dims: [ 64 ] }} ]
output [ {{ name: "output", data_type: TYPE_FP32, dims: [ 10 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
dynamic_batching {{ priority_levels: 2 default_priority_level: 2
  default_queue_policy {{ timeout_action: {action} default_timeout_microseconds: 30000000
                         allow_timeout_override: true }} }}
"""


@pytest.fixture(scope="module")
def policy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("policy")
    for action in ("DELAY", "REJECT"):
        name = action.lower()
        (tmp / "repo" / name / "1").mkdir(parents=True)
        shutil.copyfile(MLP, tmp / "repo" / name / "1" / "model.onnx")  # a symlink out of the folder is refused
        (tmp / "repo" / name / "config.pbtxt").write_text(CONFIG.format(name=name, action=action))
    running = RunningServer(tmp / "repo", ServerConfig(http_port=None), tmp / "edged.sock",
                            ModelsConfig(warmup=False))
    yield running
    running.stop()


def held_then_timed_out(server: RunningServer, model: str) -> tuple[int, dict[str, str], bytes]:
    """POST a request with a 1 ms timeout while the model's only instance is held, let it expire, release."""
    started, release = threading.Event(), threading.Event()

    def block(result: InferResponse | EdgedError) -> None:
        started.set()
        release.wait(30)

    service = server.service
    service.submit(InferRequest(model, {"input": np.zeros((1, 64), np.float32)}), block, inline=False)
    assert started.wait(10)
    body = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}],
                         "parameters": {"priority": 1, "timeout": 1000}})
    answers: list[tuple[int, dict[str, str], bytes]] = []
    client = threading.Thread(target=lambda: answers.append(server.request(
        "POST", f"/v2/models/{model}/infer", body, {"content-type": "application/json"})))
    client.start()
    version = service.version_info(model)
    for _ in range(2000):  # until the HTTP request waits in the queue behind the held one (or, REJECT, is
        if version.in_flight == 2 or answers:  # refused at its 1 ms timeout while the instance is still held)
            break
        threading.Event().wait(0.005)
    assert version.in_flight == 2 or answers
    threading.Event().wait(0.05)  # past the request's 1 ms timeout
    release.set()
    client.join(30)
    return answers[0]


def test_v2_advertises_schedule_policy(policy_server: RunningServer) -> None:
    doc = orjson.loads(policy_server.request("GET", "/v2")[2])
    assert "schedule_policy" in doc["extensions"]


def test_a_timed_out_request_of_a_delay_model_is_answered_late(policy_server: RunningServer) -> None:
    status, _, body = held_then_timed_out(policy_server, "delay")
    assert status == 200, body
    assert len(orjson.loads(body)["outputs"][0]["data"]) == 10


def test_a_timed_out_request_of_a_reject_model_is_503_request_timeout(policy_server: RunningServer) -> None:
    status, headers, body = held_then_timed_out(policy_server, "reject")
    assert status == 503
    assert headers["x-edged-error"] == "RequestTimeout"
    assert "timed out" in orjson.loads(body)["error"]

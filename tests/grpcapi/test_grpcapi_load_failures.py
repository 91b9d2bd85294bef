"""A failed model load answers alike over gRPC and HTTP, as Triton does: a load that fails because of the model is
INVALID_ARGUMENT / 400 "load failed for model 'm': why", one the memory budget refuses UNAVAILABLE / 503. Real
tritonclient.grpc and edged's client against one real daemon (a subprocess) with a small memory budget."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import tritonclient.grpc as triton_grpc
from integration.edged_daemon import DaemonProcess, config_with_fakes, start_daemon
from modelgen import add_model, mlp_weights
from tritonclient.utils import InferenceServerException

from edged.client import InvalidInputError, MemoryBudgetError
from edged.repository import MAX_CONFIG_BYTES

KEY = {"edged-key": "load-test-key"}
# Above what a 200-byte model file is estimated to need while loading (0.1 MiB), far below a 1 MB model's.
BUDGET_MB = 0.25


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, str]]:
    workdir = tmp_path_factory.mktemp("grpc-load")
    repo = workdir / "repo"
    add_model(repo, "large", None, {1: mlp_weights(500, 500, 10)})  # 1 MB of weights: over the budget
    corrupt = repo / "corrupt"
    (corrupt / "1").mkdir(parents=True)
    (corrupt / "1" / "model.onnx").write_bytes(b"\x00not an onnx file" * 12)
    config = config_with_fakes('[server]\ngrpc_port = 0\n\n[server.tcp_restricted]\n'
                               f'model-repository = "edged-key={KEY["edged-key"]}"\n\n'
                               f'[memory]\nbudget_mb = {BUDGET_MB}\n')
    running = start_daemon(workdir, config=config,
                           args=["--model-repository", str(repo), "--model-control-mode", "explicit"])
    try:
        listeners = running.client().status()["grpc_listeners"]
        yield running, next(address for address in listeners if not address.startswith("unix:"))
    finally:
        running.stop()


def _grpc_load(address: str, model: str) -> InferenceServerException:
    client = triton_grpc.InferenceServerClient(address)
    try:
        with pytest.raises(InferenceServerException) as failed:
            client.load_model(model, headers=KEY)
        assert not client.is_model_ready(model)
        return failed.value
    finally:
        client.close()


def test_a_load_that_fails_because_of_the_model_is_invalid_argument_and_400(
        daemon: tuple[DaemonProcess, str]) -> None:
    running, address = daemon
    failed = _grpc_load(address, "corrupt")
    assert failed.status() == "StatusCode.INVALID_ARGUMENT", failed.message()
    assert failed.message().startswith("load failed for model 'corrupt': "), failed.message()
    assert "onnxruntime could not load" in failed.message()
    with running.client() as client, pytest.raises(InvalidInputError) as refused:
        client.load("corrupt")
    assert refused.value.status == 400 and str(refused.value) == failed.message()


def test_a_load_the_memory_budget_refuses_is_unavailable_and_503(daemon: tuple[DaemonProcess, str]) -> None:
    running, address = daemon
    failed = _grpc_load(address, "large")
    assert failed.status() == "StatusCode.UNAVAILABLE", failed.message()
    assert failed.message().startswith("load failed for model 'large': "), failed.message()
    assert "the memory budget is" in failed.message()
    with running.client() as client, pytest.raises(MemoryBudgetError) as refused:
        client.load("large")
    assert refused.value.status == 503 and "the memory budget is" in str(refused.value)


def test_a_config_override_larger_than_the_limit_is_invalid_argument(daemon: tuple[DaemonProcess, str]) -> None:
    _, address = daemon
    config = {"parameters": {f"k{i}": {"string_value": "v" * 40} for i in range(MAX_CONFIG_BYTES // 40 + 1)}}
    client = triton_grpc.InferenceServerClient(address)
    try:
        with pytest.raises(InferenceServerException) as failed:
            client.load_model("large", config=json.dumps(config), headers=KEY)
    finally:
        client.close()
    assert failed.value.status() == "StatusCode.INVALID_ARGUMENT", failed.value.message()
    assert f"the limit of {MAX_CONFIG_BYTES} bytes" in failed.value.message(), failed.value.message()

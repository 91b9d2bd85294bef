"""Nothing waits for an execution while holding the registry lock: unloading a version whose request is still
executing (a real onnxruntime model that runs a long Loop), or reloading it with ``reload = "replace"``, leaves
loads of other models and the index free to proceed; the unload itself finishes once the execution does."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from modelgen import add_model, mlp_weights, write_slow_onnx

from edged.config import MemoryConfig, ModelsConfig
from edged.engine import InferenceService, InferRequest, InferResponse, ModelState
from edged.engine.memory_governor import MemoryGovernor
from edged.errors import EdgedError

# About four seconds of Loop steps on an idle core of the build machine: long beside loading a tiny model.
SLOW_TRIPS = 600_000
WAIT_S = 120.0  # only a bound for a hung test, never a measured figure


def _wait_for(condition: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _state(service: InferenceService, name: str) -> str:
    return next((e["state"] for e in service.repository_index() if e["name"] == name), "")


@pytest.mark.parametrize("change", ["unload", "replace reload"])
def test_a_version_leaving_with_an_execution_in_progress_blocks_no_other_registry_operation(
        tmp_path: Path, change: str) -> None:
    write_slow_onnx(tmp_path / "slow" / "1" / "model.onnx", SLOW_TRIPS)
    add_model(tmp_path, "fast", None, {1: mlp_weights(in_dim=4, hidden=4, out_dim=2)})
    settings = ModelsConfig(control_mode="explicit", warmup=False, reload="replace")
    service = InferenceService(tmp_path, settings, unload_timeout_s=WAIT_S)
    service.start()
    results: list[InferResponse | EdgedError] = []
    try:
        service.load_model("slow")
        slow = service.record_for("slow").versions[1]

        def infer() -> None:
            try:
                results.append(service.infer(InferRequest("slow", {"input": np.ones((1, 64), np.float32)})))
            except EdgedError as e:
                results.append(e)

        running = threading.Thread(target=infer)
        running.start()
        _wait_for(lambda: slow.in_flight > 0, "the slow request to start")
        leave = service.unload_model if change == "unload" else service.load_model
        unloading = threading.Thread(target=leave, args=("slow",))
        unloading.start()
        _wait_for(lambda: slow.state is not ModelState.READY, "the slow model to leave service")

        service.load_model("fast")  # blocked behind the execution before the fix
        assert service.model_ready("fast") and _state(service, "fast") == "READY"
        assert running.is_alive() and not results, "the slow execution should still be running"
        assert unloading.is_alive(), "the unload waits for the execution, outside the registry lock"

        running.join(WAIT_S)
        unloading.join(WAIT_S)
        assert isinstance(results[0], InferResponse), results  # the request in progress still completes
        assert slow.state is ModelState.UNLOADED and not slow.instances
        assert service.model_ready("slow") is (change == "replace reload")
    finally:
        service.close()


def test_reloads_while_an_older_copy_still_drains_keep_one_charge_per_copy(tmp_path: Path) -> None:
    write_slow_onnx(tmp_path / "slow" / "1" / "model.onnx", SLOW_TRIPS)
    memory = MemoryGovernor(MemoryConfig())
    settings = ModelsConfig(control_mode="explicit", warmup=False, reload="side_by_side")
    service = InferenceService(tmp_path, settings, memory=memory, unload_timeout_s=WAIT_S)
    service.start()
    try:
        service.load_model("slow")
        first = service.record_for("slow").versions[1]
        running = threading.Thread(target=service.infer,
                                   args=(InferRequest("slow", {"input": np.ones((1, 64), np.float32)}),))
        running.start()
        _wait_for(lambda: first.in_flight > 0, "the slow request to start")
        reloading = threading.Thread(target=service.load_model, args=("slow",))
        reloading.start()  # swaps in a second copy, then waits for the first one's request
        _wait_for(lambda: service.record_for("slow").versions[1] is not first, "the second copy")
        second = service.record_for("slow").versions[1]
        service.load_model("slow")  # a third copy while the first still drains
        third = service.record_for("slow").versions[1]
        assert third is not second and running.is_alive()
        assert set(memory.budget.charges()) == {"slow/1", "slow/1 (reload 2)"}, memory.budget.charges()
        running.join(WAIT_S)
        reloading.join(WAIT_S)
        assert memory.budget.charges() == {"slow/1": third.footprint_bytes}
    finally:
        service.close()

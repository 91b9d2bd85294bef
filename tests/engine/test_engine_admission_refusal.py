"""A load the memory budget refuses before it starts (admission) leaves its version UNAVAILABLE with the budget's
reason, never LOADING; a later load that fits works. Real engine, real memory governor, real ONNX models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from modelgen import add_model, mlp_weights

from edged.config import MemoryConfig, ModelsConfig
from edged.engine import InferenceService, InferRequest, ModelState
from edged.engine.memory_governor import MemoryGovernor
from edged.errors import MemoryBudgetExceeded

# A tiny MLP loads in far less than the budget; 100,000 instances are estimated at 128 KiB each at least
# (edged.memory INSTANCE_MIN_BYTES), about 12 GiB: refused at admission whatever the loads before measured.
BUDGET_MB = 1024
TOO_MANY = 100_000


def _config(count: int) -> str:
    return f'name: "m"\ninstance_group [{{ count: {count}, kind: KIND_CPU }}]\n'


def test_a_load_refused_by_the_budget_is_unavailable_with_the_reason_and_a_later_one_that_fits_works(
        tmp_path: Path) -> None:
    folder = add_model(tmp_path, "m", _config(1), {1: mlp_weights(in_dim=16, hidden=32, out_dim=2)})
    memory = MemoryGovernor(MemoryConfig(budget_mb=BUDGET_MB, policy="refuse"))
    service = InferenceService(tmp_path, ModelsConfig(control_mode="explicit", max_instance_count=TOO_MANY),
                               memory=memory)
    service.start()
    try:
        service.load_model("m")  # loaded before: its load peak is measured and remembered
        service.unload_model("m")
        (folder / "config.pbtxt").write_text(_config(TOO_MANY))
        with pytest.raises(MemoryBudgetExceeded) as refused:
            service.load_model("m")
        (entry,) = [e for e in service.repository_index() if e["name"] == "m"]
        assert (entry["version"], entry["state"]) == ("1", ModelState.UNLOADED.value)
        # the answer words it as Triton words a failed load; the index keeps the refusal itself
        assert str(refused.value) == f"load failed for model 'm': {entry['reason']}"
        assert "memory budget" in entry["reason"]
        assert memory.budget.charges() == {}, "a refused load holds no charge"

        (folder / "config.pbtxt").write_text(_config(1))
        service.load_model("m")
        assert service.model_ready("m")
        (entry,) = [e for e in service.repository_index() if e["name"] == "m"]
        assert (entry["state"], entry["reason"]) == ("READY", "")
        result = service.infer(InferRequest("m", {"input": np.zeros((1, 16), np.float32)}))
        assert result.outputs
    finally:
        service.close()


def test_an_onnx_model_with_external_data_is_estimated_with_its_data_file(tmp_path: Path) -> None:
    # Models past 2 GB must keep their weights in external data files beside model.onnx (ORT refuses a location
    # outside the model's folder); the estimate counted model.onnx alone, a few hundred bytes, so a model of any
    # size was admitted into any budget.
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = np.ones((2048, 2048), np.float32)  # 16 MiB in model.onnx.data
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "big",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2048])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2048])],
                              [numpy_helper.from_array(weights, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (tmp_path / "big" / "1").mkdir(parents=True)
    path = tmp_path / "big" / "1" / "model.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    assert path.stat().st_size < 1024
    memory = MemoryGovernor(MemoryConfig(budget_mb=8, policy="refuse"))
    assert memory.peak_estimate("big/1", path) >= weights.nbytes
    service = InferenceService(tmp_path, ModelsConfig(control_mode="explicit"), memory=memory)
    service.start()
    try:
        with pytest.raises(MemoryBudgetExceeded, match="it alone exceeds the budget"):
            service.load_model("big")
        assert memory.budget.charges() == {}
    finally:
        service.close()

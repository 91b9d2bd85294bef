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

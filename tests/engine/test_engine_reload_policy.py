"""``[models] reload`` with a real memory governor: side by side charges the new copy beside the serving one
(its own key) and leaves one charge once swapped; replace unloads the serving copy first and says so; the key
is validated."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from modelgen import add_model, mlp_weights

from edged.config import MemoryConfig, ModelsConfig, parse_config
from edged.engine import InferenceService, InferRequest, ModelState
from edged.engine.memory_governor import MemoryGovernor
from edged.errors import ConfigError


def _service(tmp_path: Path, reload: str) -> tuple[InferenceService, MemoryGovernor]:
    add_model(tmp_path, "m", None, {1: mlp_weights(in_dim=16, hidden=32, out_dim=2)})
    memory = MemoryGovernor(MemoryConfig(budget_mb=4096))
    service = InferenceService(tmp_path, ModelsConfig(control_mode="explicit", reload=reload),  # type: ignore[arg-type]
                               memory=memory)
    service.start()
    service.load_model("m")
    return service, memory


def test_a_side_by_side_reload_charges_the_new_copy_beside_the_old_and_keeps_one_charge(tmp_path: Path) -> None:
    service, memory = _service(tmp_path, "side_by_side")
    try:
        old = service.record_for("m").versions[1]
        service.load_model("m")
        new = service.record_for("m").versions[1]
        assert new is not old and new.state is ModelState.READY
        assert old.state is ModelState.UNLOADED and not old.instances
        assert memory.describe()["last_load"]["key"] == "m/1 (reload)", "the new copy had its own charge"
        assert set(memory.budget.charges()) == {"m/1"}
        assert memory.budget.charges()["m/1"] == new.footprint_bytes
        service.infer(InferRequest("m", {"input": np.zeros((1, 16), np.float32)}))
    finally:
        service.close()


def test_a_replace_reload_unloads_the_serving_copy_first_and_says_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    service, memory = _service(tmp_path, "replace")
    try:
        old = service.record_for("m").versions[1]
        with caplog.at_level(logging.WARNING, logger="edged.engine.registry"):
            service.load_model("m")
        assert old.state is ModelState.UNLOADED
        assert memory.describe()["last_load"]["key"] == "m/1", "the old copy was gone before the new one loaded"
        assert any("unavailable until its reload is ready" in r.getMessage() for r in caplog.records)
        assert service.model_ready("m") and set(memory.budget.charges()) == {"m/1"}
    finally:
        service.close()


def test_the_reload_key_is_validated_and_defaults_to_auto() -> None:
    assert parse_config("").models.reload == "auto"
    assert parse_config('[models]\nreload = "replace"\n').models.reload == "replace"
    with pytest.raises(ConfigError, match=r"models\.reload"):
        parse_config('[models]\nreload = "swap"\n')

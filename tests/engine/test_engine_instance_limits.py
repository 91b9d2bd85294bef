"""A load's instance count against the memory budget and the ``[models] max_instance_count`` limit: the budget
estimates every instance the load creates (each is a copy of the model of its own), and a count past the limit
is refused before anything loads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from engine_fakes import BACKENDS
from modelgen import add_custom_model, add_model, mlp_weights

from edged.config import MemoryConfig, ModelsConfig, parse_config
from edged.engine import InferenceService, ModelState
from edged.engine.memory_governor import MemoryGovernor
from edged.errors import ConfigError, MemoryBudgetExceeded, ModelConfigError

BUDGET_MB = 8


def test_a_load_of_many_instances_is_refused_when_they_do_not_fit_the_budget(tmp_path: Path) -> None:
    # a 0.6 MB model: one instance's expected peak (file x 5.5) fits 8 MiB, eight instances' do not
    weights = mlp_weights(in_dim=64, hidden=2048, out_dim=10)
    for name, count in (("one", 1), ("eight", 8)):
        config = f'platform: "onnxruntime_onnx"\ninstance_group [ {{ count: {count}, kind: KIND_CPU }} ]'
        add_model(tmp_path, name, config, {1: weights})
    memory = MemoryGovernor(MemoryConfig(budget_mb=BUDGET_MB, policy="refuse", load_estimate_factor=5.5))
    service = InferenceService(tmp_path, ModelsConfig(control_mode="explicit", warmup=False), memory=memory)
    try:
        service.start()
        service.load_model("one")
        service.unload_model("one")
        with pytest.raises(MemoryBudgetExceeded) as refused:  # its family kept: a 503 over HTTP, not a 400/500
            service.load_model("eight")
        message = str(refused.value)
        assert "cannot load eight/1" in message and f"the memory budget is {BUDGET_MB:.1f} MiB" in message
        needed = float(re.search(r"it needs ([\d.]+) MiB", message).group(1))  # type: ignore[union-attr]
        assert needed > BUDGET_MB, message
        assert not service.model_ready("eight")
        assert memory.budget.charges() == {}, "the refused load holds nothing"
    finally:
        service.close()


def test_an_instance_count_past_the_limit_is_a_config_error_naming_the_count_and_the_limit(tmp_path: Path) -> None:
    add_custom_model(tmp_path, "wide", "doubling",
                     "instance_group [ { count: 40, kind: KIND_CPU }, { count: 30, kind: KIND_CPU } ]")
    service = InferenceService(tmp_path, ModelsConfig(control_mode="explicit", backends=BACKENDS, warmup=False))
    try:
        service.start()
        with pytest.raises(ModelConfigError) as refused:
            service.load_model("wide")
        message = str(refused.value)
        assert "instance_group count asks for 70 instances" in message
        assert "limit of 64" in message and "[models] max_instance_count" in message
        assert not service.model_ready("wide")
    finally:
        service.close()


def test_a_raised_limit_lets_that_many_instances_load(tmp_path: Path) -> None:
    add_custom_model(tmp_path, "wide", "doubling", "instance_group [ { count: 70, kind: KIND_CPU } ]")
    service = InferenceService(tmp_path, ModelsConfig(control_mode="explicit", backends=BACKENDS, warmup=False,
                                                      max_instance_count=70))
    try:
        service.start()
        service.load_model("wide")
        version = service.record_for("wide").versions[1]
        assert version.state is ModelState.READY and len(version.instances) == 70
    finally:
        service.close()


def test_the_limit_is_a_positive_models_key_defaulting_to_64() -> None:
    assert parse_config("").models.max_instance_count == 64
    assert parse_config("[models]\nmax_instance_count = 256\n").models.max_instance_count == 256
    with pytest.raises(ConfigError, match=r"models\.max_instance_count"):
        parse_config("[models]\nmax_instance_count = 0\n")

"""A rescan (SIGHUP) in model control mode explicit loads nothing that was not asked for: found by the soak
test, where one SIGHUP loaded every bundled model (and imported torch) and grew RSS by about 160 MB."""

from __future__ import annotations

import shutil
from pathlib import Path

from modelgen import BUNDLED_MODELS

from edged.config import ModelsConfig
from edged.engine import InferenceService


def test_a_rescan_in_explicit_mode_loads_only_the_models_asked_for(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    shutil.copytree(BUNDLED_MODELS, repository)
    service = InferenceService(repository, ModelsConfig(control_mode="explicit", startup_models=("tiny_mlp",)))
    service.start()
    try:
        service.poll()
        ready = {entry["name"] for entry in service.repository_index(ready_only=True)}
        assert ready == {"tiny_mlp"}
        shutil.rmtree(repository / "tiny_mlp")
        service.poll()  # a model that was asked for and has gone is still unloaded
        assert service.repository_index(ready_only=True) == []
    finally:
        service.close()

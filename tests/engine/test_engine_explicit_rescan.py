"""A rescan (SIGHUP) in model control mode explicit loads nothing that was not asked for: found by the soak
test, where one SIGHUP loaded every bundled model (and imported torch) and grew RSS by about 160 MB."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from modelgen import BUNDLED_MODELS

from edged.config import ModelsConfig
from edged.engine import InferenceService, InferRequest
from edged.errors import ModelNotFound


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


def test_explicit_mode_names_startup_models_it_lacks_and_says_how_to_load_the_others(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Review: a startup_models entry not in the repository was ignored without a word, and a request for a model
    on disk but not loaded was told the model "is not in the repository"."""
    repository = tmp_path / "models"
    shutil.copytree(BUNDLED_MODELS / "tiny_mlp", repository / "tiny_mlp")
    shutil.copytree(BUNDLED_MODELS / "tiny_mlp", repository / "other_mlp")
    config = ModelsConfig(control_mode="explicit", startup_models=("tiny_mlp", "tiny_mpl"))
    service = InferenceService(repository, config)
    with caplog.at_level(logging.WARNING, logger="edged.engine"):
        service.start()
    try:
        assert any("startup_models names 'tiny_mpl'" in r.getMessage() for r in caplog.records), caplog.text
        with pytest.raises(ModelNotFound, match=r"'other_mlp' is in the repository but not loaded .*models load "
                                                r"other_mlp"):
            service.infer(InferRequest("other_mlp", {"input": np.zeros((1, 64), np.float32)}))
        with pytest.raises(ModelNotFound, match="is not in the repository or not loaded"):
            service.infer(InferRequest("../models", {"input": np.zeros((1, 64), np.float32)}))
    finally:
        service.close()

"""A model with BF16 tensors is refused at load, naming the tensor: numpy has no bfloat16, so edged cannot carry
them. A review found such a model loaded, advertised BF16 in its metadata and refused every request."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from edged.config import ModelsConfig
from edged.engine import InferenceService
from edged.errors import ModelConfigError


def _bf16_model(repo: Path) -> Path:
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)], "bf16",
                              [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder = repo / "bf16" / "1"
    folder.mkdir(parents=True)
    onnx.save(model, str(folder / "model.onnx"))
    return repo / "bf16"


def test_a_bf16_model_is_refused_at_load_naming_its_tensor(tmp_path: Path) -> None:
    folder = _bf16_model(tmp_path / "repo")
    service = InferenceService(tmp_path / "repo", ModelsConfig(control_mode="explicit"))
    service.start()
    try:
        with pytest.raises(ModelConfigError, match="input 'x' is TYPE_BF16, which edged cannot serve"):
            service.load_model("bf16")
    finally:
        service.close()
    validated = subprocess.run([sys.executable, "-m", "edged", "models", "validate", str(folder)],
                               capture_output=True, text=True, check=False)
    assert validated.returncode == 1 and "TYPE_BF16" in validated.stdout + validated.stderr, validated

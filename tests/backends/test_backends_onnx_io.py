"""ONNX models whose inputs and outputs are not plain tensors: scikit-learn's ZipMap output (a sequence of maps),
optional-typed inputs, and initializers a request may override, served or refused as Triton's ONNX Runtime
backend does, on a real onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edged.config import ModelsConfig
from edged.engine import InferenceService, InferRequest


def _save(folder: Path, graph: onnx.GraphProto, opsets: dict[str, int], config: str | None = None) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    model.ir_version = 8
    (folder / "1").mkdir(parents=True)
    onnx.save(model, str(folder / "1" / "model.onnx"))
    if config is not None:
        (folder / "config.pbtxt").write_text(config)


def write_zipmap_classifier(folder: Path, config: str | None = None) -> None:
    """A classifier shaped as skl2onnx exports one: a label tensor and ZipMap's probabilities, a sequence of
    {class: probability} maps (``seq(map(int64,tensor(float)))``)."""
    graph = helper.make_graph(
        [helper.make_node("ArgMax", ["X"], ["label"], axis=1, keepdims=0),
         helper.make_node("Softmax", ["X"], ["probabilities"], axis=1),
         helper.make_node("ZipMap", ["probabilities"], ["output_probability"], domain="ai.onnx.ml",
                          classlabels_int64s=[0, 1, 2])],
        "classifier", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
         helper.make_value_info("output_probability", helper.make_sequence_type_proto(
             helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, []))))])
    _save(folder, graph, {"": 17, "ai.onnx.ml": 3}, config)


def _reason(service: InferenceService, name: str) -> str:
    return next(str(entry["reason"]) for entry in service.repository_index() if entry["name"] == name)


def test_a_zipmap_output_is_refused_at_load_naming_it(tmp_path: Path) -> None:
    write_zipmap_classifier(tmp_path / "iris")
    service = InferenceService(tmp_path, ModelsConfig())
    service.start()
    try:
        assert not service.model_ready("iris")
        reason = _reason(service, "iris")
        assert "output 'output_probability'" in reason and "seq(map(int64,tensor(float)))" in reason
        assert "zipmap" in reason
    finally:
        service.close()


def test_a_zipmap_classifier_serves_the_tensors_its_config_lists(tmp_path: Path) -> None:
    config = """name: "iris"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "X", data_type: TYPE_FP32, dims: [ 3 ] } ]
output [ { name: "label", data_type: TYPE_INT64, dims: [ 1 ], reshape: { shape: [ ] } } ]
"""
    write_zipmap_classifier(tmp_path / "iris", config)
    service = InferenceService(tmp_path, ModelsConfig())
    service.start()
    try:
        x = np.array([[0.1, 3.0, 0.2], [5.0, 0.0, 1.0]], np.float32)
        assert service.infer(InferRequest("iris", {"X": x})).outputs["label"].ravel().tolist() == [1, 0]
    finally:
        service.close()


@pytest.mark.parametrize("autocomplete", [True, False])
def test_a_config_that_names_a_zipmap_output_is_refused_at_load(tmp_path: Path, autocomplete: bool) -> None:
    config = """name: "iris"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "X", data_type: TYPE_FP32, dims: [ -1, 3 ] } ]
output [ { name: "label", data_type: TYPE_INT64, dims: [ -1 ] },
         { name: "output_probability", data_type: TYPE_FP32, dims: [ -1, 3 ] } ]
"""
    write_zipmap_classifier(tmp_path / "iris", config)
    service = InferenceService(tmp_path, ModelsConfig(autocomplete=autocomplete))
    service.start()
    try:
        assert not service.model_ready("iris")
        reason = _reason(service, "iris")
        assert "'output_probability'" in reason and "seq(map(int64,tensor(float)))" in reason
    finally:
        service.close()

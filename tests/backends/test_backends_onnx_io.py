"""ONNX models whose inputs and outputs are not plain tensors: scikit-learn's ZipMap output (a sequence of maps),
optional-typed inputs, and initializers a request may override, served or refused as Triton's ONNX Runtime
backend does, on a real onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

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


def write_scaler(folder: Path, config: str | None = None) -> None:
    """y = x * scale, where "scale" is an initializer that is also a graph input: a request may override it."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "scale"], ["y"])], "scaler",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("scale", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(np.full(4, 2.0, np.float32), "scale")])
    _save(folder, graph, {"": 17}, config)


def test_an_overridable_initializer_is_an_input_when_the_config_lists_it(tmp_path: Path) -> None:
    # Triton's ONNX Runtime backend takes initializers that are also graph inputs as request inputs when the config
    # lists them; auto-complete leaves them out (the model runs with the initializer's value).
    write_scaler(tmp_path / "auto")
    write_scaler(tmp_path / "listed", """name: "listed"
platform: "onnxruntime_onnx"
input [ { name: "x", data_type: TYPE_FP32, dims: [ 2, 4 ] },
        { name: "scale", data_type: TYPE_FP32, dims: [ 4 ], optional: true } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ 2, 4 ] } ]
""")
    service = InferenceService(tmp_path, ModelsConfig())
    service.start()
    try:
        assert [spec.name for spec in service.model_config("auto").input] == ["x"]
        assert service.model_ready("listed"), _reason(service, "listed")
        x = np.ones((2, 4), np.float32)
        assert service.infer(InferRequest("listed", {"x": x})).outputs["y"].tolist() == [[2.0] * 4] * 2
        scale = np.arange(4, dtype=np.float32)
        out = service.infer(InferRequest("listed", {"x": x, "scale": scale})).outputs["y"]
        assert out.tolist() == [[0.0, 1.0, 2.0, 3.0]] * 2
    finally:
        service.close()


def write_optional_input(folder: Path, batch: bool = False) -> None:
    """An input of ONNX type optional(tensor(float)): "has" tells whether the request gave it (not an output of
    the batching variant, whose tensors all have a variable first dimension)."""
    shape: list[int | str] = ["N", 4] if batch else [4]
    maybe = helper.make_value_info("maybe", helper.make_optional_type_proto(
        helper.make_tensor_type_proto(TensorProto.FLOAT, shape)))
    has = [] if batch else [helper.make_tensor_value_info("has", TensorProto.BOOL, [])]
    graph = helper.make_graph(
        [helper.make_node("OptionalHasElement", ["maybe"], ["has"]), helper.make_node("Identity", ["x"], ["y"])],
        "optional", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape), maybe],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape), *has])
    _save(folder, graph, {"": 18})


def test_an_optional_onnx_input_is_auto_completed_as_an_optional_tensor(tmp_path: Path) -> None:
    write_optional_input(tmp_path / "opt")
    service = InferenceService(tmp_path, ModelsConfig())
    service.start()
    try:
        assert service.model_ready("opt"), _reason(service, "opt")
        maybe = service.model_config("opt").input[1]
        assert (maybe.name, maybe.data_type, maybe.dims, maybe.optional) == ("maybe", "TYPE_FP32", (4,), True)
        x = np.ones(4, np.float32)
        assert service.infer(InferRequest("opt", {"x": x})).outputs["has"].tolist() is False
        assert service.infer(InferRequest("opt", {"x": x, "maybe": x})).outputs["has"].tolist() is True
    finally:
        service.close()


def test_an_optional_input_of_a_batching_onnx_model_is_refused_as_triton_does(tmp_path: Path) -> None:
    write_optional_input(tmp_path / "opt", batch=True)
    service = InferenceService(tmp_path, ModelsConfig())
    service.start()
    try:
        assert not service.model_ready("opt")
        assert "optional input 'maybe' is not supported for models that support batching" in _reason(service, "opt")
    finally:
        service.close()

"""An output's ``reshape`` (Triton: the shape the backend produces) is undone into the config's ``dims`` before
the response leaves the engine, for a lone request and for each request of a batch, on a real ONNX model."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from edged.config import ModelsConfig
from edged.engine import InferenceService, InferRequest, InferResponse
from edged.errors import EdgedError

CONFIG = """name: "rs"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ {dims} ], reshape: {{ shape: [ {shape} ] }} }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ {dims} ], reshape: {{ shape: [ {shape} ] }} }} ]
dynamic_batching {{ }}
"""


def negating_model(repo: Path, dims: str, shape: str, model_shape: list[int | str]) -> InferenceService:
    """An ONNX Neg on ``[batch, *model_shape]`` whose config shows clients ``dims``."""
    graph = helper.make_graph([helper.make_node("Neg", ["IN"], ["OUT"])], "g",
                              [helper.make_tensor_value_info("IN", TensorProto.FLOAT, ["b", *model_shape])],
                              [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, ["b", *model_shape])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (repo / "rs" / "1").mkdir(parents=True)
    onnx.save(model, str(repo / "rs" / "1" / "model.onnx"))
    (repo / "rs" / "config.pbtxt").write_text(CONFIG.format(dims=dims, shape=shape))
    service = InferenceService(repo, ModelsConfig())
    service.start()
    return service


def test_a_lone_response_has_the_configs_dims_not_the_backends_shape(tmp_path: Path) -> None:
    service = negating_model(tmp_path, "4", "2, 2", [2, 2])
    try:
        assert service.model_metadata("rs")["outputs"][0]["shape"] == [-1, 4]
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        out = service.infer(InferRequest("rs", {"IN": x})).outputs["OUT"]
        assert out.shape == (2, 4)
        np.testing.assert_array_equal(out, -x)
    finally:
        service.close()


def test_each_request_of_a_batch_gets_its_rows_in_the_configs_dims(tmp_path: Path) -> None:
    service = negating_model(tmp_path, "-1, 4", "-1, 2, 2", ["n", 2, 2])
    results: list[InferResponse | EdgedError] = []
    all_in = threading.Event()

    def done(result: InferResponse | EdgedError) -> None:
        results.append(result)
        if len(results) == 3:
            all_in.set()

    try:
        inputs = [np.arange(12, dtype=np.float32).reshape(1, 3, 4) + 100 * i for i in range(3)]
        service.submit_many("rs", "", [(InferRequest("rs", {"IN": x}, id=str(i)), done)
                                       for i, x in enumerate(inputs)])
        assert all_in.wait(30)
        for result in results:
            assert isinstance(result, InferResponse), result
            out = result.outputs["OUT"]
            assert out.shape == (1, 3, 4)  # the backend's [1, 3, 2, 2]: its size at reshape's -1 fills dims' -1
            np.testing.assert_array_equal(out, -inputs[int(result.id)])
        stats = service.statistics("rs")["model_stats"][0]
        assert (stats["inference_count"], stats["execution_count"]) == (3, 1), "the three should share a batch"
    finally:
        service.close()

"""Small CPU runs through a bound IOBinding (edged.backends._ort_binding) on real onnxruntime sessions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from modelgen import add_model, mlp_reference, mlp_weights
from onnx import TensorProto, helper

from edged.backends._ort_binding import MAX_LAYOUTS
from edged.backends.onnxruntime import OnnxRuntimeBackend, OnnxRuntimeInstance
from edged.repository import parse_model_config


def _mlp(tmp_path: Path) -> tuple[OnnxRuntimeInstance, list[np.ndarray]]:
    weights = mlp_weights(in_dim=4, hidden=8, out_dim=3)
    add_model(tmp_path, "m", None, {1: weights})
    instance = OnnxRuntimeBackend().load(tmp_path / "m" / "1" / "model.onnx", parse_model_config('name: "m"\n'), 0)
    return instance, weights


def test_a_repeated_small_layout_runs_bound_and_its_outputs_never_alias(tmp_path: Path) -> None:
    instance, weights = _mlp(tmp_path)
    rng = np.random.default_rng(0)
    first_input, second_input = rng.random((1, 4), np.float32), rng.random((1, 4), np.float32)
    plain = instance.run({"input": first_input}, ["output"])["output"]  # learns the layout
    first = instance.run({"input": first_input}, ["output"])["output"]
    second = instance.run({"input": second_input}, ["output"])["output"]
    assert instance._bindings is not None and len(instance._bindings) == 1, "the layout was not bound"
    # the second run wrote the bound output buffer again: the first answer must be an array of its own
    np.testing.assert_array_equal(first, plain)
    np.testing.assert_allclose(first, mlp_reference(weights, first_input), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(second, mlp_reference(weights, second_input), rtol=1e-5, atol=1e-6)
    assert not np.shares_memory(first, second)
    first_input[:] = 0  # the request's buffer changing afterwards changes nothing either
    np.testing.assert_array_equal(first, plain)


def test_other_shapes_dtypes_and_outputs_run_plainly_with_a_plain_runs_result(tmp_path: Path) -> None:
    instance, weights = _mlp(tmp_path)
    x = np.ones((1, 4), np.float32)
    instance.run({"input": x}, ["output"])
    instance.run({"input": x}, ["output"])
    for batch in range(2, 2 + MAX_LAYOUTS + 2):  # more batch sizes than layouts are kept: the rest run plainly
        xs = np.arange(batch * 4, dtype=np.float32).reshape(batch, 4) / 10
        for _ in range(2):
            np.testing.assert_allclose(instance.run({"input": xs}, ["output"])["output"], mlp_reference(weights, xs),
                                       rtol=1e-5, atol=1e-5)
    assert instance._bindings is not None and len(instance._bindings) == MAX_LAYOUTS
    strided = np.ones((1, 8), np.float32)[:, ::2]  # not contiguous: copied into the bound buffer like any input
    np.testing.assert_allclose(instance.run({"input": strided}, ["output"])["output"],
                               mlp_reference(weights, np.ascontiguousarray(strided)), rtol=1e-5, atol=1e-6)
    wrong = np.ones((1, 4), np.float64)  # a bound shape with another dtype is ORT's error, as without binding
    try:
        instance.run({"input": wrong}, ["output"])
    except Exception as e:
        assert "onnxruntime rejected the input" in str(e) or "onnxruntime failed" in str(e), e
    else:
        raise AssertionError("a float64 input to a float32 model was accepted")


def _nonzero_model(path: Path) -> None:
    """Output shape [1, count of non-zeros]: it depends on the data, not only on the input's shape."""
    node = helper.make_node("NonZero", ["input"], ["output"])
    graph = helper.make_graph([node], "nonzero", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("output", TensorProto.INT64, [1, "count"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = min(model.ir_version, 9)
    path.parent.mkdir(parents=True)
    onnx.save(model, str(path))


def test_an_output_whose_shape_follows_the_data_turns_binding_off_and_is_answered_plainly(tmp_path: Path) -> None:
    path = tmp_path / "nz" / "1" / "model.onnx"
    _nonzero_model(path)
    instance = OnnxRuntimeBackend().load(path, parse_model_config('name: "nz"\n'), 0)
    two = np.array([1, 0, 2, 0], np.float32)
    three = np.array([1, 3, 2, 0], np.float32)
    np.testing.assert_array_equal(instance.run({"input": two}, ["output"])["output"], [[0, 2]])
    np.testing.assert_array_equal(instance.run({"input": three}, ["output"])["output"], [[0, 1, 2]])
    assert instance._bindings is not None and not instance._bindings.enabled
    reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for x in (two, three, np.zeros(4, np.float32)):
        np.testing.assert_array_equal(instance.run({"input": x}, ["output"])["output"],
                                      reference.run(["output"], {"input": x})[0])

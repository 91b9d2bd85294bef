"""End to end on a real GPU: build an engine from a tiny ONNX model, describe it, load it and run it.

Needs TensorRT, a CUDA binding (cuda-python or torch with CUDA) and a GPU; skipped elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

pytestmark = [
    pytest.mark.hardware,
    pytest.mark.skipif(importlib.util.find_spec("tensorrt") is None, reason="TensorRT is not installed"),
]


def doubling_onnx(path: Path) -> Path:
    """y = x * 2 for x of shape [batch, 4], batch dynamic."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    two = helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"])], "double",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], initializer=[two])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edged.backends._trt_build import build_engine
    from edged.backends._trt_buildspec import BuildSpec, parse_shape_spec

    directory = tmp_path_factory.mktemp("double") / "1"
    directory.mkdir()
    onnx = doubling_onnx(directory / "model.onnx")
    spec = BuildSpec(onnx, directory / "model.plan", "fp32", shapes=(parse_shape_spec("x:min=1x4,opt=4x4,max=8x4"),))
    result = build_engine(spec, print)
    return result.plan


def config(strategy: str = "STATIC"):  # type: ignore[no-untyped-def]
    from edged.repository.model_config import ModelConfig, TensorConfig

    return ModelConfig(name="double", backend="tensorrt", max_batch_size=8,
                       input=(TensorConfig("x", "TYPE_FP32", (4,)),), output=(TensorConfig("y", "TYPE_FP32", (4,)),),
                       parameters={"execution_context_allocation_strategy": strategy})


def test_sidecar_records_version_device_and_command(plan: Path) -> None:
    meta = json.loads(plan.with_name("model.plan.json").read_text())
    assert meta["build_command"][:2] == ["edged", "build-engine"]
    assert meta["compute_capability"] and meta["tensorrt_version"]


def test_describe_reports_dynamic_batch_and_profile_max(plan: Path) -> None:
    from edged.backends.tensorrt import TensorRTBackend

    sig = TensorRTBackend().describe(plan)
    assert [(t.name, t.data_type, t.shape) for t in sig.inputs] == [("x", "TYPE_FP32", (-1, 4))]
    assert sig.max_batch_hint == 8


@pytest.mark.parametrize("strategy", ["STATIC", "ON_PROFILE_CHANGE", "USER_MANAGED"])
def test_load_and_run(plan: Path, strategy: str) -> None:
    from edged.backends.tensorrt import TensorRTBackend

    backend = TensorRTBackend()
    instance = backend.load(plan, config(strategy), 0)
    try:
        for batch in (1, 3, 8):
            x = np.random.default_rng(batch).random((batch, 4), dtype=np.float32)
            np.testing.assert_allclose(instance.run({"x": x}, ["y"])["y"], 2 * x, rtol=1e-6)
        assert instance.info.details["allocation_strategy"] == strategy
    finally:
        instance.close()
        backend.close()


def test_engine_from_another_tensorrt_is_refused_with_rebuild_command(plan: Path, tmp_path: Path) -> None:
    from edged.backends.tensorrt import TensorRTBackend
    from edged.errors import ModelLoadError

    copy = tmp_path / "model.plan"
    copy.write_bytes(plan.read_bytes())
    meta = json.loads(plan.with_name("model.plan.json").read_text())
    meta["tensorrt_version"] = "7.0.0"
    copy.with_name("model.plan.json").write_text(json.dumps(meta))
    with pytest.raises(ModelLoadError, match="edged build-engine"):
        TensorRTBackend().load(copy, config(), 0)


def test_garbage_plan_is_refused_with_tensorrt_messages(tmp_path: Path) -> None:
    from edged.backends.tensorrt import TensorRTBackend
    from edged.errors import ModelLoadError

    bad = tmp_path / "model.plan"
    bad.write_bytes(b"not an engine" * 100)
    with pytest.raises(ModelLoadError, match="could not deserialise"):
        TensorRTBackend().load(bad, config(), 0)

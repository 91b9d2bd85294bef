"""Builds real ONNX models and model repositories for tests (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
BUNDLED_MODELS = ROOT / "models"


def mlp_weights(in_dim: int = 64, hidden: int = 256, out_dim: int = 10, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((in_dim, hidden)).astype(np.float32) * 0.1, np.zeros(hidden, np.float32),
            rng.standard_normal((hidden, out_dim)).astype(np.float32) * 0.1, np.zeros(out_dim, np.float32)]


def mlp_reference(weights: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    w0, b0, w1, b1 = weights
    return np.maximum(x @ w0 + b0, 0) @ w1 + b1


def write_mlp_onnx(path: Path, weights: list[np.ndarray], batch_dim: str | int = "batch",
                   input_name: str = "input", output_name: str = "output") -> None:
    w0, b0, w1, b1 = weights
    nodes = [helper.make_node("MatMul", [input_name, "w0"], ["h0"]), helper.make_node("Add", ["h0", "b0"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h2"]), helper.make_node("MatMul", ["h2", "w1"], ["h3"]),
             helper.make_node("Add", ["h3", "b1"], [output_name])]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, [batch_dim, w0.shape[0]])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, [batch_dim, w1.shape[1]])],
        [numpy_helper.from_array(w0, "w0"), numpy_helper.from_array(b0, "b0"), numpy_helper.from_array(w1, "w1"),
         numpy_helper.from_array(b1, "b1")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def add_model(repo: Path, name: str, config: str | None, versions: dict[int, list[np.ndarray]]) -> Path:
    """A model folder with an optional config.pbtxt and one MLP ONNX file per version."""
    folder = repo / name
    folder.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (folder / "config.pbtxt").write_text(config)
    for version, weights in versions.items():
        write_mlp_onnx(folder / str(version) / "model.onnx", weights)
    return folder


def custom_config(name: str, backend: str, extra: str = "", max_batch: int = 8) -> str:
    return f"""name: "{name}"
backend: "{backend}"
max_batch_size: {max_batch}
input [ {{ name: "input", data_type: TYPE_FP32, dims: [ 4 ] }} ]
output [ {{ name: "output", data_type: TYPE_FP32, dims: [ 4 ] }} ]
{extra}
"""


def add_custom_model(repo: Path, name: str, backend: str, extra: str = "", max_batch: int = 8) -> Path:
    """A model served by a test backend (see engine_fakes.py); its version file only has to exist."""
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model").write_bytes(b"test backend model\n")
    (folder / "config.pbtxt").write_text(custom_config(name, backend, extra, max_batch))
    return folder


def write_slow_onnx(path: Path, trips: int, width: int = 64) -> None:
    """A model whose one execution takes long: a Loop of ``trips`` small MatMul + Tanh steps on "input"."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["state_in", "w"], ["product"]),
         helper.make_node("Tanh", ["product"], ["state_out"]), helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "step",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("state_in", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("state_out", TensorProto.FLOAT, [1, width])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "cond", "input"], ["output"], body=body)], "slow",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, width])],
        [numpy_helper.from_array(np.array(trips, np.int64), "trips"), numpy_helper.from_array(np.array(True), "cond"),
         numpy_helper.from_array((np.eye(width) * 0.5).astype(np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def write_chain_onnx(path: Path, width: int = 2048, layers: int = 3) -> int:
    """``layers`` MatMul+Relu steps with [width, width] float32 weights on input "x" (3 x 2048^2: 48 MiB);
    the weights' size in bytes. Under glibc its load leaves freed 16 MiB blocks in the heap."""
    rng = np.random.default_rng(0)
    nodes, weights, previous = [], [], "x"
    for i in range(layers):
        weights.append(numpy_helper.from_array((rng.standard_normal((width, width)) / np.sqrt(width))
                                               .astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [previous, f"w{i}"], [f"m{i}"]))
        previous = "y" if i == layers - 1 else f"r{i}"
        nodes.append(helper.make_node("Relu", [f"m{i}"], [previous]))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return layers * width * width * 4


def add_tiny_delay_model(repo: Path, name: str, max_batch: int, delay_us: int) -> Path:
    """The bundled tiny_mlp as ``name``, with ``max_batch_size`` and a ``max_queue_delay_microseconds``."""
    models = ROOT / "models" / "tiny_mlp"
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.onnx").write_bytes((models / "1" / "model.onnx").read_bytes())
    config = (models / "config.pbtxt").read_text().replace('"tiny_mlp"', f'"{name}"')
    config = config.replace("max_batch_size: 64", f"max_batch_size: {max_batch}").replace(
        "dynamic_batching { }", f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}")
    (repo / name / "config.pbtxt").write_text(config)
    return repo


_ONNX_TYPES = {"BOOL": TensorProto.BOOL, "UINT8": TensorProto.UINT8, "UINT16": TensorProto.UINT16,
               "UINT32": TensorProto.UINT32, "UINT64": TensorProto.UINT64, "INT8": TensorProto.INT8,
               "INT16": TensorProto.INT16, "INT32": TensorProto.INT32, "INT64": TensorProto.INT64,
               "FP16": TensorProto.FLOAT16, "FP32": TensorProto.FLOAT, "FP64": TensorProto.DOUBLE,
               "BYTES": TensorProto.STRING}


def add_identity_model(repo: Path, name: str, datatype: str, max_batch: int = 8) -> Path:
    """An ONNX Identity model, INPUT → OUTPUT of KServe ``datatype``, dims [-1] (batched when max_batch > 0)."""
    config_type = "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"
    dims: list[str | int] = ["batch", "n"] if max_batch > 0 else ["n"]
    graph = helper.make_graph([helper.make_node("Identity", ["INPUT"], ["OUTPUT"])], "identity",
                              [helper.make_tensor_value_info("INPUT", _ONNX_TYPES[datatype], dims)],
                              [helper.make_tensor_value_info("OUTPUT", _ONNX_TYPES[datatype], dims)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    onnx.save(model, str(folder / "1" / "model.onnx"))
    (folder / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch}\n'
        f'input [ {{ name: "INPUT", data_type: {config_type}, dims: [ -1 ] }} ]\n'
        f'output [ {{ name: "OUTPUT", data_type: {config_type}, dims: [ -1 ] }} ]\n')
    return folder

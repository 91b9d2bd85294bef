#!/usr/bin/env python3
"""Regenerate the bundled sample models in ``models/`` deterministically.

- ``digits_onnx`` and ``digits_torch``: a small MLP classifier (64 → 32 → ReLU → 10 → softmax) trained with
  scikit-learn on its bundled 8×8 digits data set, exported as ONNX (built with onnx.helper from the trained
  weights) and as TorchScript. The held-out accuracy is printed and written to ``models/ACCURACY.txt``.
- ``tiny_mlp``: the benchmark model, FP32 [-1, 64] → 256 → ReLU → 10 with fixed random weights.
- ``camera_frame``: a camera-sized input for the shared-memory benchmarks: a 1080p RGB UINT8 frame
  [-1, 1080, 1920, 3] → float, NCHW, resized to 224×224 (linear), scaled by 1/255 → a 3×3 convolution with 8
  fixed random filters, stride 2 → ReLU → mean over the image: FP32 [-1, 8].
- ``tiny_llama``: a generative test model for ONNX Runtime GenAI (see ``make_genai_model.py``).

Needs the dev extra (scikit-learn, onnx, torch, transformers, tokenizers, onnx-ir,
onnxruntime-genai).
Usage: ``python scripts/make_sample_models.py [--out models]``.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import make_genai_model  # the script beside this one (run as a script, its folder is on sys.path)
import numpy as np

DIGITS_CONFIG = """name: "{name}"
{platform_line}
max_batch_size: 64
input [
  {{
    name: "{input}"
    data_type: TYPE_FP32
    dims: [ 64 ]
  }}
]
output [
  {{
    name: "{output}"
    data_type: TYPE_FP32
    dims: [ 10 ]
    label_filename: "labels.txt"
  }}
]
dynamic_batching {{
  max_queue_delay_microseconds: 0
}}
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
"""

TINY_CONFIG = """name: "tiny_mlp"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ { name: "input", data_type: TYPE_FP32, dims: [ 64 ] } ]
output [ { name: "output", data_type: TYPE_FP32, dims: [ 10 ] } ]
dynamic_batching { }
instance_group [ { count: 1, kind: KIND_CPU } ]
"""


def train_digits() -> tuple[list[np.ndarray], list[np.ndarray], float]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)  # pixels 0..16 scaled to 0..1
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.25, random_state=0,
                                                        stratify=digits.target)
    model = MLPClassifier(hidden_layer_sizes=(32,), max_iter=400, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(x_train, y_train)
    accuracy = float(model.score(x_test, y_test))
    weights = [w.astype(np.float32) for w in model.coefs_]
    biases = [b.astype(np.float32) for b in model.intercepts_]
    return weights, biases, accuracy


def mlp_onnx(weights: list[np.ndarray], biases: list[np.ndarray], softmax: bool, path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = []
    initializers = []
    current = "input"
    for index, (w, b) in enumerate(zip(weights, biases, strict=True)):
        initializers += [numpy_helper.from_array(w, f"w{index}"), numpy_helper.from_array(b, f"b{index}")]
        nodes.append(helper.make_node("MatMul", [current, f"w{index}"], [f"mm{index}"]))
        nodes.append(helper.make_node("Add", [f"mm{index}", f"b{index}"], [f"add{index}"]))
        current = f"add{index}"
        if index < len(weights) - 1:
            nodes.append(helper.make_node("Relu", [current], [f"relu{index}"]))
            current = f"relu{index}"
    if softmax:
        nodes.append(helper.make_node("Softmax", [current], ["output"], axis=1))
    else:
        nodes.append(helper.make_node("Identity", [current], ["output"]))
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", weights[0].shape[0]])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", weights[-1].shape[1]])],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="edged")
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def mlp_torchscript(weights: list[np.ndarray], biases: list[np.ndarray], path: Path) -> None:
    import torch

    layers: list[torch.nn.Module] = []
    for index, (w, b) in enumerate(zip(weights, biases, strict=True)):
        linear = torch.nn.Linear(w.shape[0], w.shape[1])
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(w.T.copy()))
            linear.bias.copy_(torch.from_numpy(b))
        layers.append(linear)
        if index < len(weights) - 1:
            layers.append(torch.nn.ReLU())
    layers.append(torch.nn.Softmax(dim=1))
    module = torch.jit.script(torch.nn.Sequential(*layers).eval())
    path.parent.mkdir(parents=True, exist_ok=True)
    module.save(str(path))


CAMERA_CONFIG = """name: "camera_frame"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "frame", data_type: TYPE_UINT8, dims: [ 1080, 1920, 3 ] } ]
output [ { name: "features", data_type: TYPE_FP32, dims: [ 8 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""


def camera_onnx(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    initializers = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.2, "filters"),
        numpy_helper.from_array(np.zeros(8, np.float32), "bias"),
        numpy_helper.from_array(np.array([1 / 255], np.float32), "scale"),
        numpy_helper.from_array(np.array([224, 224], np.int64), "target_hw"),
        numpy_helper.from_array(np.array([0], np.int64), "start"),
        numpy_helper.from_array(np.array([2], np.int64), "end"),
    ]
    nodes = [
        helper.make_node("Cast", ["frame"], ["as_float"], to=TensorProto.FLOAT),
        helper.make_node("Transpose", ["as_float"], ["nchw"], perm=[0, 3, 1, 2]),
        helper.make_node("Shape", ["nchw"], ["full_shape"]),
        helper.make_node("Slice", ["full_shape", "start", "end"], ["batch_channels"]),
        helper.make_node("Concat", ["batch_channels", "target_hw"], ["sizes"], axis=0),
        helper.make_node("Resize", ["nchw", "", "", "sizes"], ["resized"], mode="linear"),
        helper.make_node("Mul", ["resized", "scale"], ["normalised"]),
        helper.make_node("Conv", ["normalised", "filters", "bias"], ["conv"], kernel_shape=[3, 3], strides=[2, 2]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        helper.make_node("ReduceMean", ["relu"], ["features"], axes=[2, 3], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "camera_frame",
        [helper.make_tensor_value_info("frame", TensorProto.UINT8, ["batch", 1080, 1920, 3])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 8])],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="edged")
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def write_camera_model(out: Path) -> None:
    (out / "camera_frame" / "1").mkdir(parents=True, exist_ok=True)
    (out / "camera_frame" / "config.pbtxt").write_text(CAMERA_CONFIG)
    camera_onnx(out / "camera_frame" / "1" / "model.onnx")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "models")
    out: Path = parser.parse_args().out
    weights, biases, accuracy = train_digits()
    labels = "\n".join(str(d) for d in range(10)) + "\n"
    for name, platform, model_file in (("digits_onnx", 'platform: "onnxruntime_onnx"', "model.onnx"),
                                       ("digits_torch", 'backend: "pytorch"', "model.pt")):
        target = out / name
        io = ("input", "output") if name == "digits_onnx" else ("INPUT__0", "OUTPUT__0")
        (target / "1").mkdir(parents=True, exist_ok=True)
        (target / "config.pbtxt").write_text(DIGITS_CONFIG.format(
            name=name, platform_line=platform, input=io[0], output=io[1]))
        (target / "labels.txt").write_text(labels)
        if model_file == "model.onnx":
            mlp_onnx(weights, biases, True, target / "1" / model_file)
        else:
            mlp_torchscript(weights, biases, target / "1" / model_file)
    rng = np.random.default_rng(0)
    tiny_w = [rng.standard_normal((64, 256)).astype(np.float32) * 0.1,
              rng.standard_normal((256, 10)).astype(np.float32) * 0.1]
    tiny_b = [np.zeros(256, np.float32), np.zeros(10, np.float32)]
    (out / "tiny_mlp" / "1").mkdir(parents=True, exist_ok=True)
    (out / "tiny_mlp" / "config.pbtxt").write_text(TINY_CONFIG)
    mlp_onnx(tiny_w, tiny_b, False, out / "tiny_mlp" / "1" / "model.onnx")
    write_camera_model(out)
    make_genai_model.build(out)
    (out / "ACCURACY.txt").write_text(
        f"digits classifier (scikit-learn MLPClassifier 64-32-10, random_state=0), held-out accuracy on 25% of "
        f"scikit-learn's digits data set (450 images): {accuracy:.4f}\n")
    print(f"wrote sample models to {out}; digits held-out accuracy {accuracy:.4f}")


if __name__ == "__main__":
    main()

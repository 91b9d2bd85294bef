"""The ONNX Runtime and PyTorch backends on real runtimes (CPU): providers, fallbacks, formats, parameters."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from modelgen import add_model, mlp_reference, mlp_weights

from edged.backends.onnxruntime import OnnxRuntimeBackend, plan_providers, provider_options
from edged.backends.pytorch import PyTorchBackend, cuda_allocator_plan, positional_order, translate_failure
from edged.config import ModelsConfig
from edged.engine import InferenceService, InferRequest
from edged.errors import BackendUnavailable, InferenceFailed, InvalidInput, ModelLoadError, OutOfMemory
from edged.repository import parse_model_config

TORCH_CONFIG = """name: "{name}"
backend: "pytorch"
max_batch_size: 8
input [ {{ name: "x", data_type: TYPE_FP32, dims: [ 4 ] }} ]
output [ {{ name: "y", data_type: TYPE_FP32, dims: [ 2 ] }} ]
{extra}
"""


class Affine(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)
        with torch.no_grad():
            self.linear.weight.copy_(torch.arange(8, dtype=torch.float32).reshape(2, 4) / 10)
            self.linear.bias.copy_(torch.tensor([1.0, -1.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def expected(x: np.ndarray) -> np.ndarray:
    w = np.arange(8, dtype=np.float32).reshape(2, 4) / 10
    return x @ w.T + np.array([1.0, -1.0], np.float32)


def test_a_torch_export_program_is_served_from_model_pt2(tmp_path: Path) -> None:
    folder = tmp_path / "exported"
    (folder / "1").mkdir(parents=True)
    batch = torch.export.Dim("batch", min=1, max=8)
    program = torch.export.export(Affine().eval(), (torch.zeros(2, 4),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(program, str(folder / "1" / "model.pt2"))
    (folder / "config.pbtxt").write_text(TORCH_CONFIG.format(name="exported", extra=""))
    service = InferenceService(tmp_path, ModelsConfig())
    service.start()
    try:
        x = np.random.default_rng(0).random((3, 4), dtype=np.float32)
        out = service.infer(InferRequest("exported", {"x": x})).outputs["y"]
        np.testing.assert_allclose(out, expected(x), rtol=1e-5, atol=1e-6)
        assert service.version_info("exported").describe_instances()[0]["format"] == "pt2"
    finally:
        service.close()


def test_torchscript_without_a_full_config_is_refused_with_what_to_write(tmp_path: Path) -> None:
    folder = tmp_path / "ts"
    (folder / "1").mkdir(parents=True)
    torch.jit.script(Affine()).save(str(folder / "1" / "model.pt"))
    (folder / "config.pbtxt").write_text('name: "ts"\nbackend: "pytorch"\n')
    service = InferenceService(tmp_path, ModelsConfig())
    service.start()
    try:
        index = service.repository_index()
        assert "need a config.pbtxt listing every input and output" in index[0]["reason"]
    finally:
        service.close()


def test_a_gpu_instance_without_cuda_fails_unless_fallback_is_allowed(tmp_path: Path) -> None:
    folder = tmp_path / "gpu"
    (folder / "1").mkdir(parents=True)
    torch.jit.script(Affine()).save(str(folder / "1" / "model.pt"))
    text = TORCH_CONFIG.format(name="gpu", extra="instance_group [ { kind: KIND_GPU } ]")
    config = parse_model_config(text)
    backend = PyTorchBackend()
    with pytest.raises(BackendUnavailable, match="no CUDA device"):
        backend.load(folder / "1" / "model.pt", config, 0)
    allowed = parse_model_config(text + 'parameters { key: "allow_provider_fallback" value: { string_value: "true" } }')
    instance = backend.load(folder / "1" / "model.pt", allowed, 0)
    assert instance.info.device == "cpu" and "no CUDA device" in (instance.info.fallback or "")
    x = np.ones((1, 4), np.float32)
    np.testing.assert_allclose(instance.run({"x": x}, ["y"])["y"], expected(x), rtol=1e-5)


def test_torch_allocator_parameters_are_checked() -> None:
    good = parse_model_config(TORCH_CONFIG.format(name="m", extra='parameters [ { key: "cuda_memory_fraction" '
                              'value: { string_value: "0.5" } }, { key: "cuda_allocator_settings" value: '
                              '{ string_value: "expandable_segments:True" } } ]'))
    assert cuda_allocator_plan(good) == (0.5, "expandable_segments:True")
    bad = parse_model_config(TORCH_CONFIG.format(name="m", extra='parameters { key: "cuda_memory_fraction" '
                             'value: { string_value: "1.5" } }'))
    with pytest.raises(ModelLoadError, match=r"expected a number in \(0, 1\], found '1.5'"):
        cuda_allocator_plan(bad)


@pytest.mark.parametrize("value", ["300", "-3", "two"])
@pytest.mark.parametrize("key", ["intra_op_thread_count", "inter_op_thread_count"])
def test_thread_counts_a_device_cannot_run_are_refused_naming_the_parameter(tmp_path: Path, key: str,
                                                                             value: str) -> None:
    # 100000 (a typo) made ORT's load create threads for minutes with the registry held, and killed the
    # daemon through libgomp ('Thread creation failed') at torch's next run
    parameter = f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}'
    add_model(tmp_path, "m", None, {1: mlp_weights(in_dim=4, hidden=8, out_dim=2)})
    onnx_config = parse_model_config(f'name: "m"\n{parameter}')
    with pytest.raises(ModelLoadError, match=f"parameter {key}: expected an integer from 0 to 64 .*found '{value}'"):
        OnnxRuntimeBackend().load(tmp_path / "m" / "1" / "model.onnx", onnx_config, 0)
    (tmp_path / "ts" / "1").mkdir(parents=True)
    torch.jit.script(Affine()).save(str(tmp_path / "ts" / "1" / "model.pt"))
    threads = torch.get_num_threads()
    try:
        with pytest.raises(ModelLoadError, match=f"parameter {key}: expected an integer from 0 to 64"):
            PyTorchBackend().load(tmp_path / "ts" / "1" / "model.pt",
                                  parse_model_config(TORCH_CONFIG.format(name="ts", extra=parameter)), 0)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("key", ["INTRA_OP_THREAD_COUNT", "NUM_THREADS"])
def test_tritons_pytorch_thread_parameters_are_applied(tmp_path: Path, key: str) -> None:
    # the names Triton's PyTorch backend reads (TorchScript; NUM_THREADS for torch.export); a Triton config's
    # count was ignored and torch ran on every core beside the other models
    (tmp_path / "ts" / "1").mkdir(parents=True)
    torch.jit.script(Affine()).save(str(tmp_path / "ts" / "1" / "model.pt"))
    threads = torch.get_num_threads()
    wanted = 1 if threads > 1 else 2
    parameter = f'parameters {{ key: "{key}" value: {{ string_value: "{wanted}" }} }}'
    try:
        PyTorchBackend().load(tmp_path / "ts" / "1" / "model.pt",
                              parse_model_config(TORCH_CONFIG.format(name="ts", extra=parameter)), 0)
        assert torch.get_num_threads() == wanted
        bad = parameter.replace(f'"{wanted}"', '"300"')
        with pytest.raises(ModelLoadError, match=f"parameter {key}: expected an integer from 0 to 64"):
            PyTorchBackend().load(tmp_path / "ts" / "1" / "model.pt",
                                  parse_model_config(TORCH_CONFIG.format(name="ts", extra=bad)), 0)
    finally:
        torch.set_num_threads(threads)


def test_indexed_names_map_to_positions() -> None:
    assert positional_order(["OUTPUT__1", "OUTPUT__0"]) == [1, 0]
    assert positional_order(["a", "b"]) == [0, 1]


def test_onnx_providers_follow_parameters_then_instance_kind() -> None:
    assert plan_providers(parse_model_config('name: "m"\n')).requested == ("cpu",)
    gpu = parse_model_config('name: "m"\ninstance_group [ { kind: KIND_GPU } ]\noptimization { '
                             'execution_accelerators { gpu_execution_accelerator : [ { name : "tensorrt" } ] } }\n')
    assert plan_providers(gpu).requested == ("tensorrt", "cuda", "cpu")
    explicit = parse_model_config('name: "m"\nparameters { key: "providers" value: { string_value: "cuda, cpu" } }')
    assert plan_providers(explicit).requested == ("cuda", "cpu")
    with pytest.raises(ModelLoadError, match="unknown provider 'tpu'"):
        plan_providers(parse_model_config('name: "m"\nparameters { key: "providers" value: { string_value: "tpu" } }'))


def test_a_missing_onnx_provider_fails_the_load_or_falls_back_visibly(tmp_path: Path) -> None:
    weights = mlp_weights(in_dim=4, hidden=8, out_dim=2)
    add_model(tmp_path, "m", None, {1: weights})
    path = tmp_path / "m" / "1" / "model.onnx"
    backend = OnnxRuntimeBackend()
    cuda = parse_model_config('name: "m"\nparameters { key: "providers" value: { string_value: "cuda,cpu" } }')
    with pytest.raises(BackendUnavailable, match="cuda requested by model m are not available"):
        backend.load(path, cuda, 0)
    allowed = parse_model_config('name: "m"\nparameters [ { key: "providers" value: { string_value: "cuda,cpu" } },'
                                 ' { key: "allow_provider_fallback" value: { string_value: "true" } } ]')
    instance = backend.load(path, allowed, 0)
    assert instance.info.providers == ("CPUExecutionProvider",) and "cuda" in (instance.info.fallback or "")
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(instance.run({"input": x}, ["output"])["output"], mlp_reference(weights, x),
                               rtol=1e-5, atol=1e-6)


def test_a_truncated_onnx_file_is_a_load_error_naming_the_file(tmp_path: Path) -> None:
    add_model(tmp_path, "m", None, {1: mlp_weights(in_dim=4, hidden=8, out_dim=2)})
    path = tmp_path / "m" / "1" / "model.onnx"
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ModelLoadError, match=str(path)):
        OnnxRuntimeBackend().describe(path)


def test_gpu_ids_come_from_device_nodes(tmp_path: Path) -> None:
    from edged.backends.onnxruntime import cuda_device_ids

    assert cuda_device_ids(tmp_path) == ()
    (tmp_path / "nvhost-gpu").touch()  # a Jetson up to Orin: one integrated GPU
    assert cuda_device_ids(tmp_path) == (0,)
    for name in ("nvidia1", "nvidia0", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    assert cuda_device_ids(tmp_path) == (0, 1)


def test_kind_auto_stays_on_the_cpu_with_a_cpu_only_onnxruntime(tmp_path: Path) -> None:
    add_model(tmp_path, "auto", 'name: "auto"\nplatform: "onnxruntime_onnx"\ninstance_group [ { count: 1 } ]\n',
              {1: mlp_weights(in_dim=4, hidden=8, out_dim=2)})
    service = InferenceService(tmp_path, ModelsConfig())
    service.start()
    try:
        assert [g.kind for g in service.model_config("auto").instance_group] == ["KIND_CPU"]
        assert service.model_ready("auto")
    finally:
        service.close()


def test_bytes_inputs_reach_onnx_string_tensors_as_text(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["s"], ["o"])], "g",
                              [helper.make_tensor_value_info("s", TensorProto.STRING, ["b", 1])],
                              [helper.make_tensor_value_info("o", TensorProto.STRING, ["b", 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (tmp_path / "echo" / "1").mkdir(parents=True)
    onnx.save(model, str(tmp_path / "echo" / "1" / "model.onnx"))
    service = InferenceService(tmp_path, ModelsConfig())
    service.start()
    try:
        words = np.array([[b"caf\xc3\xa9"], [b"ok"]], dtype=object)
        out = service.infer(InferRequest("echo", {"s": words})).outputs["o"]
        assert out.ravel().tolist() == ["café", "ok"]
        bad = np.array([[b"\xff"]], dtype=object)
        with pytest.raises(InvalidInput, match="not UTF-8"):
            service.infer(InferRequest("echo", {"s": bad}))
    finally:
        service.close()


@pytest.mark.parametrize(("error", "family"), [
    (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 7.44 GiB total)"),
     OutOfMemory),
    (RuntimeError("NVML_SUCCESS == r INTERNAL ASSERT FAILED\nCUDA out of memory"), OutOfMemory),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), InferenceFailed),
    (RuntimeError("CUDA error: device-side assert triggered: index out of bounds, shape [4]"), InferenceFailed),
    (RuntimeError("Expected all tensors to be on the same device, but found cuda:0 and cpu"), InferenceFailed),
    (RuntimeError("The size of tensor a (5) must match the size of tensor b (4) at non-singleton dimension 1"),
     InvalidInput),
    (RuntimeError("forward() expected at most 2 argument(s) but received 3 argument(s)."), InvalidInput),
])
def test_torch_failures_keep_their_family(error: Exception, family: type) -> None:
    translated = translate_failure(torch, error)
    assert type(translated) is family


def test_onnx_feeds_the_python_wrapper_would_refuse_are_still_refused(tmp_path: Path) -> None:
    # Runs go to the compiled session past ORT's Python wrapper; a feed without a required input still goes
    # through the wrapper (which names the missing input) and an unknown name is still invalid input.
    weights = mlp_weights(in_dim=4, hidden=8, out_dim=2)
    add_model(tmp_path, "m", None, {1: weights})
    instance = OnnxRuntimeBackend().load(tmp_path / "m" / "1" / "model.onnx", parse_model_config('name: "m"'), 0)
    x = np.ones((1, 4), np.float32)
    np.testing.assert_allclose(instance.run({"input": x}, ["output"])["output"], mlp_reference(weights, x),
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(InferenceFailed, match=r"Required inputs .*input.* are missing"):
        instance.run({}, ["output"])
    with pytest.raises(InvalidInput, match="Invalid input name: bogus"):
        instance.run({"input": x, "bogus": x}, ["output"])
    instance.close()
    with pytest.raises(InferenceFailed, match="closed"):
        instance.run({"input": x}, ["output"])


@pytest.mark.parametrize(("text", "level"), [
    ("", "ORT_ENABLE_ALL"),
    ("optimization { graph { level: 0 } }", "ORT_ENABLE_ALL"),
    ("optimization { graph { level: -1 } }", "ORT_ENABLE_BASIC"),
    ("optimization { graph { level: 1 } }", "ORT_ENABLE_EXTENDED"),
    ("optimization { graph { level: 2 } }", "ORT_DISABLE_ALL"),  # a common work-around for an optimizer bug
    ('optimization { graph { level: 2 } }\nparameters { key: "graph_optimization_level" value: { string_value: '
     '"basic" } }', "ORT_ENABLE_BASIC"),  # edged's own parameter, where given, decides
])
def test_onnx_sessions_take_tritons_graph_optimization_level(tmp_path: Path, text: str, level: str) -> None:
    # as Triton's ONNX Runtime backend maps optimization.graph.level; before, edged ignored it (always ENABLE_ALL)
    add_model(tmp_path, "m", None, {1: mlp_weights(in_dim=4, hidden=8, out_dim=2)})
    instance = OnnxRuntimeBackend().load(tmp_path / "m" / "1" / "model.onnx", parse_model_config(f'name: "m"\n{text}'),
                                         0)
    assert instance.info.details["graph_optimization_level"] == level


ACCELERATOR = ('name: "m"\ninstance_group [ { kind: KIND_GPU } ]\noptimization { execution_accelerators { '
               'gpu_execution_accelerator: [ { name: "tensorrt" %s } ] } }\n')


def test_tensorrt_accelerator_parameters_reach_the_tensorrt_provider(tmp_path: Path) -> None:
    # Triton's form of the TensorRT options: before, edged read only its own model-level parameters, so
    # precision_mode FP16 here built FP32 engines and the workspace size was ignored
    path = tmp_path / "m" / "1" / "model.onnx"
    config = parse_model_config(ACCELERATOR % ('parameters { key: "precision_mode" value: "FP16" } parameters { key: '
                                               '"max_workspace_size_bytes" value: "1073741824" } parameters { key: '
                                               '"trt_max_partition_iterations" value: "10" }'))
    assert plan_providers(config).requested == ("tensorrt", "cuda", "cpu")
    options = provider_options("tensorrt", config, path)
    assert options["trt_fp16_enable"] == "True"
    assert options["trt_max_workspace_size"] == "1073741824"
    assert options["trt_max_partition_iterations"] == "10"
    assert options["trt_engine_cache_path"] == str(tmp_path / "m" / "1" / "trt_cache")
    int8 = provider_options("tensorrt", parse_model_config(ACCELERATOR % 'parameters { key: "precision_mode" '
                                                                         'value: "INT8" }'), path)
    assert int8["trt_int8_enable"] == "True" and "trt_fp16_enable" not in int8


@pytest.mark.parametrize(("params", "match"), [
    ('parameters { key: "precision_mode" value: "FP8" }', "precision_mode 'FP8' is not one of FP32, FP16, BF16, INT8"),
    ('parameters { key: "max_workspace_size_bytes" value: "lots" }', "max_workspace_size_bytes 'lots' is not"),
    ('parameters { key: "speed" value: "max" }', "unknown parameter 'speed' of the tensorrt execution accelerator"),
    ('parameters { key: "trt_engine_cache_path" value: "/tmp/x" }', "set the model parameter trt_engine_cache_path"),
])
def test_tensorrt_accelerator_parameters_edged_cannot_apply_fail_the_load(tmp_path: Path, params: str,
                                                                           match: str) -> None:
    add_model(tmp_path, "m", None, {1: mlp_weights(in_dim=4, hidden=8, out_dim=2)})
    with pytest.raises(ModelLoadError, match=match):  # on a CPU-only build too: the config is wrong everywhere
        OnnxRuntimeBackend().load(tmp_path / "m" / "1" / "model.onnx", parse_model_config(ACCELERATOR % params), 0)


@pytest.mark.parametrize(("accelerators", "match"), [
    ('gpu_execution_accelerator: [ { name: "TensorRT" } ]', "unknown GPU execution accelerator 'TensorRT' in model m "
                                                            r"\(Triton knows tensorrt, cuda\)"),
    ('cpu_execution_accelerator: [ { name: "tensorrt" } ]', r"unknown CPU execution accelerator 'tensorrt' in model "
                                                            r"m \(Triton knows openvino\)"),
])
def test_an_execution_accelerator_triton_does_not_know_fails_the_load(tmp_path: Path, accelerators: str,
                                                                      match: str) -> None:
    # before: ignored, so a misspelt tensorrt ran on CUDA alone (or the CPU) with no word
    add_model(tmp_path, "m", None, {1: mlp_weights(in_dim=4, hidden=8, out_dim=2)})
    config = parse_model_config(f'name: "m"\noptimization {{ execution_accelerators {{ {accelerators} }} }}\n')
    with pytest.raises(ModelLoadError, match=match):
        OnnxRuntimeBackend().load(tmp_path / "m" / "1" / "model.onnx", config, 0)

"""Loads of real ONNX models whose configs reshape inputs or carry warm-up entries, platforms and backends:
warm-up reaches the model in the shape requests do, and config errors are refused as the config's (400)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from modelgen import add_model, mlp_reference, mlp_weights
from onnx import TensorProto, helper, numpy_helper

from edged.config import ModelsConfig
from edged.engine import InferenceService, InferRequest, ModelState
from edged.errors import ModelConfigError
from edged.repository import model_config_to_json
from edged.repository.model_config import ModelConfig

WARMUP = ('model_warmup [ {{ name: "w", batch_size: {batch}, inputs {{ key: "input" value: {{ data_type: '
          '{dtype}, dims: {dims}, zero_data: true }} }} }} ]')


def config(name: str, *, head: str = 'platform: "onnxruntime_onnx"', dims: str = "[ 64 ]", extra: str = "",
           max_batch: int = 8) -> str:
    return (f'name: "{name}"\n{head}\nmax_batch_size: {max_batch}\n'
            f'input [ {{ name: "input", data_type: TYPE_FP32, dims: {dims} {extra} }} ]\n'
            'output [ { name: "output", data_type: TYPE_FP32, dims: [ 10 ] } ]\n')


@pytest.fixture
def service(tmp_path: Path) -> Iterator[InferenceService]:
    engine = InferenceService(tmp_path, ModelsConfig(control_mode="explicit"))
    engine.start()
    yield engine
    engine.close()


def test_a_reshaped_input_warms_up_loads_and_answers_as_the_flat_model(tmp_path: Path,
                                                                       service: InferenceService) -> None:
    weights = mlp_weights()
    add_model(tmp_path, "flat", config("flat"), {1: weights})
    add_model(tmp_path, "square", config("square", dims="[ 8, 8 ]", extra="reshape: { shape: [ 64 ] }"),
              {1: weights})
    service.load_model("flat")
    service.load_model("square")  # warm-up ran on [1, 8, 8] reshaped to [1, 64]
    assert service.version_info("square").state is ModelState.READY
    x = np.random.default_rng(3).random((1, 64), dtype=np.float32)
    flat = service.infer(InferRequest("flat", {"input": x})).outputs["output"]
    square = service.infer(InferRequest("square", {"input": x.reshape(1, 8, 8)})).outputs["output"]
    np.testing.assert_allclose(square, flat, rtol=1e-6)
    np.testing.assert_allclose(square, mlp_reference(weights, x), rtol=1e-5, atol=1e-6)


def test_a_warmup_entry_on_a_reshaped_input_is_reshaped_too(tmp_path: Path, service: InferenceService) -> None:
    warmup = WARMUP.format(batch=2, dtype="TYPE_FP32", dims="[ 8, 8 ]")
    add_model(tmp_path, "square", config("square", dims="[ 8, 8 ]", extra="reshape: { shape: [ 64 ] }") + warmup,
              {1: mlp_weights()})
    service.load_model("square")
    assert service.version_info("square").state is ModelState.READY


@pytest.mark.parametrize(("head", "match"), [
    ('platform: "ensemble"', r"config\.pbtxt: field 'platform' is 'ensemble', which edged does not serve; "
                             "supported platforms: onnxruntime_onnx"),
    ('platform: "tensorflow_savedmodel"', "field 'platform' is 'tensorflow_savedmodel'"),
    ('backend: "tensorflow"', r"config\.pbtxt: field 'backend' is 'tensorflow', which edged does not know; "
                              "supported backends: onnxruntime, onnxruntime_genai, pytorch, tensorrt"),
    ('platform: "onnxruntime_onnx"\nbackend: "pytorch"', "field 'platform' is 'onnxruntime_onnx' .*but field "
                                                          "'backend' is 'pytorch'"),
])
def test_a_platform_or_backend_edged_does_not_serve_is_a_config_error(
        tmp_path: Path, service: InferenceService, head: str, match: str) -> None:
    add_model(tmp_path, "m", config("m", head=head), {1: mlp_weights()})
    with pytest.raises(ModelConfigError, match=match):
        service.load_model("m")


@pytest.mark.parametrize(("extra", "match"), [
    ("model_transaction_policy { decoupled: true }", r"field 'model_transaction_policy\.decoupled' is true"),
    ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "n" data_type: TYPE_FP32 source_input: "input" } ]',
     r"field 'batch_input': batch inputs \(ragged batching\) are not supported by edged"),
    ('model_repository_agents { agents [ { name: "checksum" } ] }', "field 'model_repository_agents'"),
])
def test_a_field_edged_does_not_implement_is_a_config_error_at_load(
        tmp_path: Path, service: InferenceService, extra: str, match: str) -> None:
    # before: each loaded and answered every request once, over HTTP too, as if the field were not there
    add_model(tmp_path, "m", config("m") + extra, {1: mlp_weights()})
    with pytest.raises(ModelConfigError, match=r"config\.pbtxt: " + match):
        service.load_model("m")


def test_a_ragged_input_is_a_config_error_at_load(tmp_path: Path, service: InferenceService) -> None:
    add_model(tmp_path, "m", config("m", extra="allow_ragged_batch: true") + "dynamic_batching { }",
              {1: mlp_weights()})
    with pytest.raises(ModelConfigError, match=r"input 'input': field 'allow_ragged_batch' is true"):
        service.load_model("m")


@pytest.mark.parametrize(("warmup", "match"), [
    (WARMUP.format(batch=100000, dtype="TYPE_FP32", dims="[ 64 ]"),
     r"model_warmup\[0\] \('w'\): field 'batch_size' is 100000, more than 8"),
    (WARMUP.format(batch=1, dtype="TYPE_INT32", dims="[ 64 ]"),
     r"field 'inputs\[input\]\.data_type' is TYPE_INT32, but input 'input' is TYPE_FP32"),
    (WARMUP.format(batch=1, dtype="TYPE_FP32", dims="[ 1000000000000 ]"),
     r"field 'inputs\[input\]\.dims' is \[1000000000000\], but input 'input' has dims \[64\]"),
    (WARMUP.format(batch=1, dtype="TYPE_FP32", dims="[ 64 ]").replace('key: "input"', 'key: "nope"'),
     r"field 'inputs\[nope\]' names no input of the model \(inputs: input\)"),
])
def test_a_warmup_entry_that_does_not_fit_the_config_is_a_config_error(
        tmp_path: Path, service: InferenceService, warmup: str, match: str) -> None:
    add_model(tmp_path, "m", config("m") + warmup, {1: mlp_weights()})
    with pytest.raises(ModelConfigError, match=r"config\.pbtxt: .*" + match):
        service.load_model("m")


def test_warmup_elements_are_bounded_by_the_tensor_limit(tmp_path: Path) -> None:
    add_model(tmp_path, "m", config("m") + WARMUP.format(batch=8, dtype="TYPE_FP32", dims="[ 64 ]"),
              {1: mlp_weights()})
    engine = InferenceService(tmp_path, ModelsConfig(control_mode="explicit"), max_elements=100)
    engine.start()
    try:
        with pytest.raises(ModelConfigError, match=r"makes 512 elements .*limit of 100 "
                                                   r"\(\[server\] max_tensor_elements\)"):
            engine.load_model("m")
    finally:
        engine.close()


def test_a_model_declaring_dims_past_the_tensor_limit_loads_without_a_generated_warmup(
        tmp_path: Path, service: InferenceService) -> None:
    # no request can be that large, so a warm-up of that size (4 TiB here: the load failed 'Unable to allocate',
    # and a few GiB would have been allocated and run) exercises nothing; Triton loads such a model
    huge = 1 << 40
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "huge",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", huge])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", huge])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (tmp_path / "huge" / "1").mkdir(parents=True)
    onnx.save(model, str(tmp_path / "huge" / "1" / "model.onnx"))
    service.load_model("huge")
    assert service.model_ready("huge") and service.model_config("huge").input[0].dims == (huge,)


def test_an_autocompleted_per_item_scalar_input_warms_up_and_answers(tmp_path: Path,
                                                                      service: InferenceService) -> None:
    # input [batch]: auto-complete makes it dims [1] with an empty reshape, so warm-up's [1, 1] must become [1]
    graph = helper.make_graph([helper.make_node("Add", ["x", "one"], ["y"])], "plus_one",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])],
                              [numpy_helper.from_array(np.ones((), np.float32), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (tmp_path / "scalar" / "1").mkdir(parents=True)
    onnx.save(model, str(tmp_path / "scalar" / "1" / "model.onnx"))
    service.load_model("scalar")
    spec = service.model_config("scalar").input[0]
    assert spec.dims == (1,) and spec.reshape is not None and spec.reshape.shape == ()
    out = service.infer(InferRequest("scalar", {"x": np.array([[2.0], [5.0]], np.float32)})).outputs["y"]
    np.testing.assert_allclose(out.reshape(-1), [3.0, 6.0])


def test_a_config_naming_no_platform_or_backend_loads_the_runtime_of_its_model_file(
        tmp_path: Path, service: InferenceService) -> None:
    # Triton's auto-complete derives the backend from model.onnx; edged looked for '1/model' (500)
    weights = mlp_weights()
    add_model(tmp_path, "partial", "max_batch_size: 2\n", {1: weights})
    add_model(tmp_path, "full", config("full"), {1: weights})
    service.load_model("partial")
    completed = service.model_config("partial")
    assert (completed.platform, completed.backend, completed.default_model_filename) == (
        "onnxruntime_onnx", "onnxruntime", "model.onnx")
    x = np.random.default_rng(5).random((2, 64), dtype=np.float32)
    out = service.infer(InferRequest("partial", {"input": x})).outputs["output"]
    np.testing.assert_allclose(out, mlp_reference(weights, x), rtol=1e-5, atol=1e-6)
    service.load_model("full")
    service.load_model("full", ModelConfig(name="full", max_batch_size=2))  # an override without platform, too
    assert service.model_config("full").max_batch_size == 2
    assert service.version_info("full").state is ModelState.READY


@pytest.mark.parametrize(("text", "words"), [
    (config("rs", dims="[ 63 ]", extra="reshape: { shape: [ 64 ] }"),
     "input 'input': field 'reshape' shape [64] holds another number of elements than dims [63]"),
    (config("rs").replace("dims: [ 10 ] }", "dims: [ 3, 3 ] reshape: { shape: [ 10 ] } }"),
     "output 'output': field 'reshape' shape [10] holds another number of elements than dims [3, 3]"),
])
def test_a_reshape_of_another_element_count_is_a_config_error_at_load(tmp_path: Path, service: InferenceService,
                                                                       text: str, words: str) -> None:
    add_model(tmp_path, "rs", text, {1: mlp_weights()})
    with pytest.raises(ModelConfigError) as caught:  # before: a ModelLoadError (500) from the warm-up, or a load
        service.load_model("rs")                      # whose every infer was a 500
    assert str(caught.value).startswith(f"load failed for model 'rs': {tmp_path / 'rs' / 'config.pbtxt'}: {words}"), \
        caught.value


FILE_WARMUP = ('model_warmup [ { name: "w", batch_size: 2, inputs { key: "input" value: { data_type: TYPE_FP32, '
               'dims: [ 64 ], input_data_file: "in.bin" } } } ]\n')


def test_a_warmup_data_file_too_short_for_its_tensor_is_a_config_error_at_load(tmp_path: Path,
                                                                               service: InferenceService) -> None:
    folder = add_model(tmp_path, "wf", config("wf") + FILE_WARMUP, {1: mlp_weights()})
    (folder / "warmup").mkdir()
    (folder / "warmup" / "in.bin").write_bytes(b"\0" * 100)
    with pytest.raises(ModelConfigError) as caught:  # before: a ModelLoadError (500) from inside the load
        service.load_model("wf")
    data = folder / "warmup" / "in.bin"
    assert str(caught.value) == (f"load failed for model 'wf': input_data_file of warm-up 'w' input 'input' "
                                 f"'in.bin' ({data}) holds 100 bytes, fewer than the 512 of its tensor (TYPE_FP32, "
                                 "shape [2, 64])")
    (folder / "warmup" / "in.bin").write_bytes(np.ones(2 * 64 + 1000, np.float32).tobytes())  # longer: a prefix
    service.load_model("wf")
    assert service.model_ready("wf")


def test_a_preferred_batch_size_above_max_batch_size_is_a_config_error_at_load(tmp_path: Path,
                                                                               service: InferenceService) -> None:
    add_model(tmp_path, "pb", config("pb", max_batch=2) + "dynamic_batching { preferred_batch_size: [ 2, 64 ] }\n",
              {1: mlp_weights()})
    with pytest.raises(ModelConfigError, match=r"pb/config\.pbtxt: field 'dynamic_batching\.preferred_batch_size' "
                                               r"holds 64, more than max_batch_size 2"):
        service.load_model("pb")  # before: it loaded, and every batch waited out its whole delay


def _add_with_default_bias(repo: Path, name: str, optional: str) -> None:
    """y = x + bias, where bias is an ONNX initializer (100): an input a request may give or leave out."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "bias"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("bias", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.full(4, 100, np.float32), "bias")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (repo / name / "1").mkdir(parents=True)
    onnx.save(model, str(repo / name / "1" / "model.onnx"))
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        'input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] }, '
        f'{{ name: "bias", data_type: TYPE_FP32, dims: [ 4 ] {optional} }} ]\n'
        'output [ { name: "y", data_type: TYPE_FP32, dims: [ 4 ] } ]\n')


def test_an_optional_input_that_is_an_onnx_initializer_takes_its_default_when_left_out(
        tmp_path: Path, service: InferenceService) -> None:
    # Triton's ONNX Runtime backend takes an initializer as an optional request input; before, the load was refused
    # ("input 'bias' is in the config but not in the model file"), since ORT lists initializers apart from inputs
    _add_with_default_bias(tmp_path, "m", "optional: true")
    service.load_model("m")
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(service.infer(InferRequest("m", {"x": x})).outputs["y"], x + 100)
    bias = np.full(4, 0.5, np.float32)
    np.testing.assert_array_equal(service.infer(InferRequest("m", {"x": x, "bias": bias})).outputs["y"], x + 0.5)


def test_an_onnx_initializer_named_as_a_required_input_is_a_config_error(tmp_path: Path,
                                                                          service: InferenceService) -> None:
    _add_with_default_bias(tmp_path, "m", "")
    with pytest.raises(ModelConfigError, match=r"input 'bias' is an initializer of the model file \(it has a "
                                               r"default value\): mark it optional: true"):
        service.load_model("m")


def test_a_format_without_three_dims_is_a_config_error_at_load(tmp_path: Path, service: InferenceService) -> None:
    add_model(tmp_path, "m", config("m", extra="format: FORMAT_NHWC"), {1: mlp_weights()})  # before: it loaded
    with pytest.raises(ModelConfigError, match=r"config\.pbtxt: input 'input': field 'format' is FORMAT_NHWC"):
        service.load_model("m")


def test_a_missing_label_file_is_a_config_error_at_load(tmp_path: Path, service: InferenceService) -> None:
    # Triton's load fails when an output's label_filename cannot be read; before, edged loaded the model and its
    # classification answers silently lacked every label (a misspelt labels.txt went unnoticed)
    text = config("m").replace('dims: [ 10 ] }', 'dims: [ 10 ], label_filename: "labels.txt" }')
    folder = add_model(tmp_path, "m", text, {1: mlp_weights()})
    with pytest.raises(ModelConfigError, match=r"label_filename of output 'output' 'labels\.txt': no such file in "
                                               "the model folder"):
        service.load_model("m")
    (folder / "labels.txt").write_text("".join(f"digit {i}\n" for i in range(10)))
    service.load_model("m")
    assert service.version_info("m").state is ModelState.READY


def test_a_warmup_entry_without_batch_size_is_skipped_and_reported_as_triton_does(
        tmp_path: Path, service: InferenceService) -> None:
    # Triton skips a warm-up sample whose batch_size is 0 (protobuf's unset), and reports batch_size and count as
    # given (0 when unset); before, edged ran it as a batch of 1 (a file Triton never reads failed the load here)
    entry = ('model_warmup [ { name: "w", inputs { key: "input" value: { data_type: TYPE_FP32, dims: [ 64 ], '
             'input_data_file: "missing.bin" } } } ]')
    add_model(tmp_path, "m", config("m") + entry, {1: mlp_weights()})
    service.load_model("m")
    assert service.version_info("m").state is ModelState.READY
    warmup = model_config_to_json(service.model_config("m"))["model_warmup"][0]
    assert (warmup["batch_size"], warmup["count"]) == (0, 0)

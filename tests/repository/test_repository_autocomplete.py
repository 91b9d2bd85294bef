"""Auto-complete from model signatures, following Triton's ONNX Runtime backend; the CLI on real ONNX files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edged.errors import ModelConfigError
from edged.repository import autocomplete, parse_model_config
from edged.repository.model_config import ModelSignature, TensorSignature

REPO_ROOT = Path(__file__).resolve().parents[2]


def sig(name: str, shape: tuple[int, ...], data_type: str = "TYPE_FP32") -> TensorSignature:
    return TensorSignature(name, data_type, shape)


BATCHING = ModelSignature(inputs=(sig("x", (-1, 3, 8, 8)),), outputs=(sig("y", (-1, 10)), sig("n", (-1,))))


def test_empty_config_is_filled_with_default_max_batch_four_and_dynamic_batching() -> None:
    config = autocomplete(None, "net", BATCHING, "onnxruntime")
    assert (config.platform, config.backend, config.max_batch_size) == ("onnxruntime_onnx", "onnxruntime", 4)
    assert [(t.name, t.data_type, t.dims) for t in config.input] == [("x", "TYPE_FP32", (3, 8, 8))]
    assert config.output[0].dims == (10,)
    # A per-item scalar becomes dims [1] with an empty reshape, as Triton's AutoCompleteIO writes it.
    assert config.output[1].dims == (1,) and config.output[1].reshape is not None
    assert config.output[1].reshape.shape == ()
    assert config.dynamic_batching is not None and config.dynamic_batching.preferred_batch_size == (4,)
    assert [(g.name, g.kind, g.count) for g in config.instance_group] == [("net", "KIND_CPU", 2)]
    assert config.default_model_filename == "model.onnx"


def test_configured_max_batch_and_tensorrt_profile_hint_are_kept() -> None:
    config = autocomplete(parse_model_config("max_batch_size: 16"), "net", BATCHING, "onnxruntime")
    assert config.max_batch_size == 16
    hinted = ModelSignature(BATCHING.inputs, BATCHING.outputs, max_batch_hint=32)
    trt = autocomplete(None, "net", hinted, "tensorrt")
    assert (trt.max_batch_size, trt.platform) == (32, "tensorrt_plan")
    assert [g.count for g in trt.instance_group] == [1]


def test_model_that_cannot_batch_keeps_full_shapes_and_rejects_a_max_batch() -> None:
    fixed = ModelSignature(inputs=(sig("x", (1, 4)),), outputs=(sig("y", (1, 2)),))
    config = autocomplete(None, "fixed", fixed, "onnxruntime")
    assert (config.max_batch_size, config.input[0].dims, config.dynamic_batching) == (0, (1, 4), None)
    with pytest.raises(ModelConfigError, match="cannot batch"):
        autocomplete(parse_model_config("max_batch_size: 8"), "fixed", fixed, "onnxruntime")


def test_partial_tensors_are_filled_and_checked() -> None:
    config = autocomplete(parse_model_config('max_batch_size: 2 input { name: "x" }'), "net", BATCHING,
                          "onnxruntime")
    assert (config.input[0].data_type, config.input[0].dims) == ("TYPE_FP32", (3, 8, 8))
    assert [t.name for t in config.output] == ["y", "n"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('max_batch_size: 2 input { name: "z" data_type: TYPE_FP32 dims: 1 } output { name: "y" }',
         "input 'z' is in the config but not in the model file; the model's inputs are: x"),
        ('max_batch_size: 2 input { name: "x" data_type: TYPE_INT8 dims: [3, 8, 8] } output { name: "y" }',
         "input 'x' has data_type TYPE_INT8 in the config but TYPE_FP32 in the model file"),
        ('max_batch_size: 2 input { name: "x" data_type: TYPE_FP32 dims: [3, 8] } output { name: "y" }',
         "input 'x' has shape [-1, 3, 8] in the config (batch dimension included) but [-1, 3, 8, 8]"),
        ('input { name: "x" data_type: TYPE_FP32 dims: [3, 8, 8] } output { name: "y" }',
         "shape [3, 8, 8] in the config"),
        ('backend: "tensorrt"', "names runtime 'tensorrt' but the model file is for 'onnxruntime'"),
    ],
)
def test_mismatches_name_the_tensor_expected_and_found(text: str, words: str) -> None:
    with pytest.raises(ModelConfigError) as caught:
        autocomplete(parse_model_config(text), "net", BATCHING, "onnxruntime")
    assert words in str(caught.value)


def test_reshape_is_what_is_compared_with_the_model() -> None:
    text = ('max_batch_size: 2 input { name: "x" data_type: TYPE_FP32 dims: [192] reshape { shape: [3, 8, 8] } }'
            ' output { name: "y" data_type: TYPE_FP32 dims: [10] }')
    config = autocomplete(parse_model_config(text), "net", BATCHING, "onnxruntime")
    assert config.input[0].dims == (192,)


# --- the CLI, on real ONNX files read by onnxruntime -----------------------------------------------------
def write_onnx(path: Path, batch: str | int) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["INPUT0"], ["OUTPUT0"])], "relu",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [batch, 16])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [batch, 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True)
    onnx.save(model, str(path))


def run_validate(*args: str) -> subprocess.CompletedProcess[str]:
    code = ("import sys, argparse\nfrom edged.cli.models_validate import register_validate\n"
            "p = argparse.ArgumentParser(); s = p.add_subparsers(); register_validate(s)\n"
            "a = p.parse_args(sys.argv[1:]); sys.exit(a.handler(a))")
    return subprocess.run([sys.executable, "-c", code, "validate", *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=120, check=False)


def test_validate_autocompletes_a_model_folder_without_config(tmp_path: Path) -> None:
    write_onnx(tmp_path / "relu" / "1" / "model.onnx", "batch")
    result = run_validate(str(tmp_path / "relu"), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["name"], data["max_batch_size"], data["input"][0]["dims"]) == ("relu", 4, [16])
    assert data["dynamic_batching"]["preferred_batch_size"] == [4]


def test_validate_reports_a_mismatch_and_a_syntax_error_with_position(tmp_path: Path) -> None:
    write_onnx(tmp_path / "relu" / "1" / "model.onnx", 1)
    config = tmp_path / "relu" / "config.pbtxt"
    config.write_text('max_batch_size: 8\ninput { name: "INPUT0" data_type: TYPE_FP32 dims: [16] }\n'
                      'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [16] }\n')
    result = run_validate(str(config))
    assert result.returncode == 1
    assert "needs a variable first dimension" in result.stderr
    config.write_text('name: "relu"\nmax_batch_size 8\n')
    result = run_validate(str(tmp_path / "relu"))
    assert result.returncode == 1
    assert f"{config}:2:16: expected ':' after field 'max_batch_size'" in result.stderr


def test_validate_prints_json_and_a_summary_of_kept_fields(tmp_path: Path) -> None:
    write_onnx(tmp_path / "relu" / "1" / "model.onnx", "batch")
    (tmp_path / "relu" / "config.pbtxt").write_text(
        'name: "relu"\nresponse_cache { enable: true }\n')
    result = run_validate(str(tmp_path / "relu"))
    assert result.returncode == 0, result.stderr
    assert "note: field 'response_cache' is kept" in result.stdout
    assert '"response_cache": {' in result.stdout


def test_validate_refuses_a_config_naming_files_outside_the_model_folder(tmp_path: Path) -> None:
    write_onnx(tmp_path / "relu" / "1" / "model.onnx", "batch")
    config = tmp_path / "relu" / "config.pbtxt"
    config.write_text('name: "relu"\noutput { name: "OUTPUT0" data_type: TYPE_FP32 dims: [16] '
                      'label_filename: "/etc/passwd" }\n')
    result = run_validate(str(tmp_path / "relu"))
    assert result.returncode == 1
    assert "label_filename of output 'OUTPUT0' '/etc/passwd' is an absolute path" in result.stderr
    config.write_text('name: "relu"\ndefault_model_filename: "../../other.onnx"\n')
    result = run_validate(str(tmp_path / "relu"))
    assert result.returncode == 1
    assert "default_model_filename '../../other.onnx' leads outside the model folder" in result.stderr


def test_validate_reports_sequence_batching_as_an_error_at_its_line(tmp_path: Path) -> None:
    write_onnx(tmp_path / "relu" / "1" / "model.onnx", "batch")
    config = tmp_path / "relu" / "config.pbtxt"
    config.write_text('name: "relu"\nmax_batch_size: 4\nsequence_batching { max_sequence_idle_microseconds: 5 }\n')
    result = run_validate(str(tmp_path / "relu"))
    assert result.returncode == 1
    assert f"{config}:3:1: field 'sequence_batching': stateful (sequence) models are not supported" in result.stderr
    assert "ok: model" not in result.stdout


def test_reading_a_model_for_auto_complete_prints_no_onnxruntime_warnings(tmp_path: Path) -> None:
    # describing a model opened an ORT session at ORT's default log level: its warnings (an initializer that is
    # also an input) went to stderr with terminal colour codes, into the daemon's journal and validate's output
    from onnx import numpy_helper

    graph = helper.make_graph([helper.make_node("Mul", ["x", "scale"], ["y"])], "scaler",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
                               helper.make_tensor_value_info("scale", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
                              [numpy_helper.from_array(np.full(4, 2.0, np.float32), "scale")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (tmp_path / "scaler" / "1").mkdir(parents=True)
    onnx.save(model, str(tmp_path / "scaler" / "1" / "model.onnx"))
    result = run_validate(str(tmp_path / "scaler"), "--json")
    assert result.returncode == 0, result.stderr
    assert "onnxruntime" not in result.stderr and "\x1b[" not in result.stderr

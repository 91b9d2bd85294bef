"""The config checks a load and ``edged models validate`` share: platform and backend, and model_warmup
entries against the config's inputs and max_batch_size; validate on real folders exits 1 where a load refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from modelgen import add_model, mlp_weights

from edged.errors import ModelConfigError
from edged.repository import (
    check_io_and_groups,
    check_platform_backend,
    check_reshapes,
    check_supported,
    check_warmup,
    parse_model_config,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
PATH = "/repo/m/config.pbtxt"
IO = ('input [ { name: "input", data_type: TYPE_FP32, dims: [ 64 ] } ]\n'
      'output [ { name: "output", data_type: TYPE_FP32, dims: [ 10 ] } ]\n')


def warmup(batch: int = 1, key: str = "input", dtype: str = "TYPE_FP32", dims: str = "[ 64 ]") -> str:
    return (f'model_warmup [ {{ name: "w", batch_size: {batch}, inputs {{ key: "{key}" value: {{ data_type: '
            f'{dtype}, dims: {dims}, zero_data: true }} }} }} ]\n')


def config(head: str = 'platform: "onnxruntime_onnx"', max_batch: int = 8, extra: str = "") -> str:
    return f'name: "m"\n{head}\nmax_batch_size: {max_batch}\n{IO}{extra}'


@pytest.mark.parametrize(("head", "match"), [
    ('platform: "ensemble"', "/repo/m/config.pbtxt: field 'platform' is 'ensemble', which edged does not serve; "
                             "supported platforms: onnxruntime_onnx, tensorrt_plan, pytorch_libtorch, torch_export"),
    ('platform: "tensorflow_savedmodel"', "field 'platform' is 'tensorflow_savedmodel'"),
    ('backend: "tensorflow"', "field 'backend' is 'tensorflow', which edged does not know; supported backends: "
                              "onnxruntime, onnxruntime_genai, pytorch, tensorrt"),
    ('platform: "onnxruntime_onnx"\nbackend: "pytorch"',
     "field 'platform' is 'onnxruntime_onnx' \\(backend 'onnxruntime'\\) but field 'backend' is 'pytorch'"),
])
def test_platform_and_backend_edged_does_not_serve_are_refused(head: str, match: str) -> None:
    with pytest.raises(ModelConfigError, match=match):
        check_platform_backend(parse_model_config(config(head)), PATH)


@pytest.mark.parametrize("head", ['platform: "onnxruntime_onnx"', 'backend: "onnxruntime"',
                                  'platform: "onnxruntime_onnx"\nbackend: "onnxruntime"',
                                  'platform: "torch_export"\nbackend: "pytorch"', ""])
def test_platforms_and_backends_edged_serves_pass(head: str) -> None:
    check_platform_backend(parse_model_config(config(head)), PATH)


def test_a_custom_backend_passes_when_the_caller_checks_names_itself() -> None:
    check_platform_backend(parse_model_config(config('backend: "my_backend"')), PATH, backends=None)


@pytest.mark.parametrize(("max_batch", "extra", "match"), [
    (8, warmup(batch=9), r"field 'batch_size' is 9, more than 8 \(max_batch_size 8\)"),
    (0, warmup(batch=2), r"field 'batch_size' is 2, more than 1 \(max_batch_size 0\)"),
    (8, warmup(key="nope"), r"field 'inputs\[nope\]' names no input of the model \(inputs: input\)"),
    (8, warmup(dtype="TYPE_FP16"), r"field 'inputs\[input\]\.data_type' is TYPE_FP16, but input 'input' is "
                                   "TYPE_FP32"),
    (8, warmup(dims="[ 8, 8 ]"), r"field 'inputs\[input\]\.dims' is \[8, 8\], but input 'input' has dims \[64\]"),
    (8, warmup(dims="[ 1000000000000 ]"), r"field 'inputs\[input\]\.dims' is \[1000000000000\]"),
    (8, 'model_warmup [ { name: "w", batch_size: 1 } ]',
     r"field 'inputs' has no entry for the model's input 'input'"),
    (8, warmup().replace("batch_size: 1,", "batch_size: 1, count: 4294967295,"),
     r"field 'count' is 4294967295, more than the limit of 10000 runs"),
])
def test_warmup_entries_that_do_not_fit_the_config_are_refused(max_batch: int, extra: str, match: str) -> None:
    with pytest.raises(ModelConfigError, match=r"^/repo/m/config\.pbtxt: model_warmup\[0\] \('w'\): " + match):
        check_warmup(parse_model_config(config(max_batch=max_batch, extra=extra)), PATH, 1 << 26)


def test_warmup_elements_are_bounded_and_fitting_entries_pass() -> None:
    fitting = parse_model_config(config(extra=warmup(batch=8)))
    check_warmup(fitting, PATH, 512)
    with pytest.raises(ModelConfigError, match=r"makes 512 elements \(batch_size x dims\), more than the limit of "
                                               r"511 \(\[server\] max_tensor_elements\)"):
        check_warmup(fitting, PATH, 511)
    variable = parse_model_config(config(extra=warmup(dims="[ 100 ]")).replace("dims: [ 64 ] }", "dims: [ -1 ] }"))
    check_warmup(variable, PATH, 1 << 26)  # -1 allows any size


def run_validate(folder: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    code = ("import sys, argparse\nfrom edged.cli.models_validate import register_validate\n"
            "p = argparse.ArgumentParser(); s = p.add_subparsers(); register_validate(s)\n"
            "a = p.parse_args(sys.argv[1:]); sys.exit(a.handler(a))")
    return subprocess.run([sys.executable, "-c", code, "validate", *flags, str(folder)], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=120, check=False)


# Fields of Triton's schema whose semantics edged does not implement: served as if they were absent, a request
# would get another answer than Triton's (or none at all), so a load and validate refuse them by name.
UNSUPPORTED = [
    ("model_transaction_policy { decoupled: true }", r"field 'model_transaction_policy\.decoupled' is true: "
                                                      "decoupled models .* are not supported by edged"),
    ("model_transaction_policy { decoupled: 1 }", r"field 'model_transaction_policy\.decoupled' is true"),
    ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "n" data_type: TYPE_FP32 source_input: "input" } ]',
     r"field 'batch_input': batch inputs \(ragged batching\) are not supported by edged"),
    ('batch_output [ { target_name: "output" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "input" } ]',
     r"field 'batch_output': batch outputs \(ragged batching\) are not supported by edged"),
    ('model_repository_agents { agents [ { name: "checksum" parameters { key: "MD5:1/model.onnx" value: "0" } } ] }',
     r"field 'model_repository_agents': repository agents \(checksum, relocation\) are not run by edged"),
    ('runtime: "model.py"', r"field 'runtime' is 'model\.py': edged serves each backend with its own runtime"),
    ('runtime: "../x/libtriton_onnxruntime.so"', r"field 'runtime' is '\.\./x/libtriton_onnxruntime\.so'"),
    ('model_operations { op_library_filename: "libmyops.so" }',
     r"field 'model_operations\.op_library_filename': custom operation libraries are not loaded by edged"),
]


@pytest.mark.parametrize(("extra", "match"), UNSUPPORTED)
def test_fields_whose_semantics_edged_does_not_implement_are_refused(extra: str, match: str) -> None:
    with pytest.raises(ModelConfigError, match=r"^/repo/m/config\.pbtxt: " + match):
        check_supported(parse_model_config(config(extra=extra)), PATH)


def test_ragged_inputs_are_refused_by_name() -> None:
    ragged = parse_model_config(config().replace("dims: [ 64 ] }", "dims: [ -1 ] allow_ragged_batch: true }", 1))
    with pytest.raises(ModelConfigError, match=r"input 'input': field 'allow_ragged_batch' is true: ragged "
                                               "batching is not supported by edged"):
        check_supported(ragged, PATH)


@pytest.mark.parametrize("extra", ['runtime: "libtriton_onnxruntime.so"', 'runtime: ""',
                                   "model_transaction_policy { decoupled: false }", "model_transaction_policy { }",
                                   "response_cache { enable: true }", "model_operations { }",
                                   "model_repository_agents { }", "batch_input [ ]"])
def test_fields_that_change_no_answer_pass(extra: str) -> None:
    check_supported(parse_model_config(config(extra=extra)), PATH)  # a cache off, as Triton without one


def test_validate_refuses_a_decoupled_model(tmp_path: Path) -> None:
    add_model(tmp_path, "m", config(extra="model_transaction_policy { decoupled: true }"), {1: mlp_weights()})
    result = run_validate(tmp_path / "m")
    assert result.returncode == 1, result.stdout
    assert "field 'model_transaction_policy.decoupled' is true" in result.stderr, result.stderr


# Triton's ValidateModelConfig refuses each of these (model_config_utils.cc); before, edged loaded them and ignored
# the field (a shape tensor on an ONNX model, a TensorRT profile on a CPU one) or served them another way.
TRITON_RULES = [
    ('input [ { name: "i", data_type: TYPE_FP32, dims: [ 64 ], format: FORMAT_NCHW } ]',
     r"input 'i': field 'format' is FORMAT_NCHW, which needs 3 dims \(C, H, W in some order\); found dims \[64\]"),
    ('input [ { name: "i", data_type: TYPE_FP32, dims: [ 64 ], is_shape_tensor: true } ]',
     r"input 'i': field 'is_shape_tensor' is true, but shape tensors are only supported by TensorRT models"),
    ('output [ { name: "o", data_type: TYPE_FP32, dims: [ 64 ], is_shape_tensor: true } ]',
     r"output 'o': field 'is_shape_tensor' is true, but shape tensors are only supported by TensorRT models"),
    ('input [ { name: "i", data_type: TYPE_FP32, dims: [ 3, 4, 4 ], is_non_linear_format_io: true } ]',
     r"input 'i': field 'is_non_linear_format_io' is true, but non-linear formats are only supported by TensorRT"),
    ('instance_group [ { kind: KIND_CPU, profile: "0" } ]',
     r"instance_group\[0\]: field 'profile' names TensorRT optimization profiles, but the model is onnxruntime's"),
    ('instance_group [ { kind: KIND_CPU, gpus: [ 0 ] } ]',
     r"instance_group\[0\]: kind KIND_CPU with field 'gpus' \[0\]; GPUs go with kind KIND_GPU"),
    ('instance_group [ { kind: KIND_MODEL, gpus: [ 0 ] } ]',
     r"instance_group\[0\]: kind KIND_MODEL with field 'gpus' \[0\]"),
    ('instance_group [ { secondary_devices [ { kind: KIND_NVDLA } ] } ]',
     r"instance_group\[0\]: field 'secondary_devices' \(NVDLA\) is only supported by TensorRT models"),
]


@pytest.mark.parametrize(("extra", "match"), TRITON_RULES)
def test_what_tritons_validation_refuses_of_inputs_outputs_and_instance_groups_is_refused(extra: str,
                                                                                          match: str) -> None:
    with pytest.raises(ModelConfigError, match=r"^/repo/m/config\.pbtxt: " + match):
        check_io_and_groups(parse_model_config(f'name: "m"\nbackend: "onnxruntime"\n{extra}'), PATH)


def test_tensorrt_models_may_use_shape_tensors_profiles_and_nvdla() -> None:
    check_io_and_groups(parse_model_config(
        'name: "m"\nplatform: "tensorrt_plan"\ninput [ { name: "i", data_type: TYPE_INT32, dims: [ 2 ], '
        'is_shape_tensor: true }, { name: "j", data_type: TYPE_FP32, dims: [ 3, 8, 8 ], format: FORMAT_NCHW, '
        'is_non_linear_format_io: true } ]\ninstance_group [ { kind: KIND_GPU, gpus: [ 0 ], profile: [ "0", "1" ], '
        'secondary_devices [ { kind: KIND_NVDLA, device_id: 0 } ] } ]\n'), PATH)


def test_validate_refuses_a_shape_tensor_on_an_onnx_model(tmp_path: Path) -> None:
    add_model(tmp_path, "m", config().replace("dims: [ 64 ] }", "dims: [ 64 ], is_shape_tensor: true }", 1),
              {1: mlp_weights()})
    result = run_validate(tmp_path / "m")
    assert result.returncode == 1, result.stdout
    assert "field 'is_shape_tensor' is true" in result.stderr, result.stderr


def test_validate_exits_1_on_what_a_load_refuses(tmp_path: Path) -> None:
    refused = {"ens": config('platform: "ensemble"'), "tf": config('platform: "tensorflow_savedmodel"'),
               "mix": config('platform: "onnxruntime_onnx"\nbackend: "pytorch"'),
               "wname": config(extra=warmup(key="nope")), "wbatch": config(extra=warmup(batch=100000))}
    for name, text in refused.items():
        add_model(tmp_path, name, text.replace('name: "m"', f'name: "{name}"'), {1: mlp_weights()})
    add_model(tmp_path, "custom", config('backend: "my_backend"').replace('name: "m"', 'name: "custom"'),
              {1: mlp_weights()})
    # one interpreter per folder is slow: check them in one child, the same code path as the CLI's
    code = ("import sys\nfrom pathlib import Path\nfrom edged.cli.models_validate import validate_path\n"
            "from edged.errors import EdgedError\nfor f in sys.argv[1:]:\n"
            "    try:\n        r = validate_path(Path(f)); print(f'ok {Path(f).name}', r.warnings)\n"
            "    except EdgedError as e:\n        print(f'error {Path(f).name}', e)\n")
    out = subprocess.run([sys.executable, "-c", code, *(str(tmp_path / n) for n in [*refused, "custom"])],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=120, check=True).stdout
    for name in refused:
        assert f"error {name} {tmp_path / name / 'config.pbtxt'}: " in out, out
    assert "error custom" in out and "field 'backend' is 'my_backend', which edged does not know" in out, out
    result = run_validate(tmp_path / "ens")  # and the CLI itself exits 1
    assert result.returncode == 1 and "field 'platform' is 'ensemble'" in result.stderr, result.stderr


def test_validate_accepts_a_custom_backend_only_where_the_config_names_it(tmp_path: Path) -> None:
    add_model(tmp_path, "s4", 'name: "s4"\nbackend: "python"\n', {1: mlp_weights()})
    refused = run_validate(tmp_path / "s4")  # the daemon refuses the load with a 400: so does validate
    assert refused.returncode == 1, refused.stdout
    assert "field 'backend' is 'python', which edged does not know" in refused.stderr, refused.stderr
    toml = tmp_path / "edged.toml"
    toml.write_text('[models.backends]\npython = "my_pkg.backend:PythonBackend"\n')
    accepted = run_validate(tmp_path / "s4", "--config", str(toml))
    assert accepted.returncode == 0, accepted.stderr
    assert "the --config file's [models] backends names it" in accepted.stdout, accepted.stdout


def test_validate_exits_1_on_folders_the_daemon_cannot_load(tmp_path: Path) -> None:
    head = 'platform: "onnxruntime_onnx"\n'
    (tmp_path / "nofile" / "1").mkdir(parents=True)
    (tmp_path / "nofile" / "config.pbtxt").write_text(head)
    (tmp_path / "noversion").mkdir()
    (tmp_path / "noversion" / "config.pbtxt").write_text(head)
    add_model(tmp_path, "gap", head, {1: mlp_weights()})
    (tmp_path / "gap" / "2").mkdir()  # the newest version, the one served, is empty
    add_model(tmp_path, "policy", head + "version_policy: { specific: { versions: [ 3 ] } }\n", {1: mlp_weights()})
    expected = {"nofile": f"version 1 has no model file model.onnx (expected {tmp_path}/nofile/1/model.onnx)",
                "noversion": "no numbered version folder in", "gap": "version 2 has no model file model.onnx",
                "policy": "no version to serve"}
    for name, words in expected.items():
        result = run_validate(tmp_path / name)
        assert result.returncode == 1 and words in result.stderr, (name, result.stdout, result.stderr)


def test_validate_completes_a_config_without_platform_as_the_daemon_loads_it(tmp_path: Path) -> None:
    add_model(tmp_path, "partial", "max_batch_size: 2\n", {1: mlp_weights()})
    result = run_validate(tmp_path / "partial", "--json")
    assert result.returncode == 0, result.stderr
    completed = json.loads(result.stdout)
    assert (completed["platform"], completed["backend"], completed["default_model_filename"]) == (
        "onnxruntime_onnx", "onnxruntime", "model.onnx")


def test_validate_refuses_a_fifo_or_a_link_to_a_device_as_config_with_an_error_line(tmp_path: Path) -> None:
    (tmp_path / "fifo" / "1").mkdir(parents=True)
    os.mkfifo(tmp_path / "fifo" / "config.pbtxt")
    (tmp_path / "zero" / "1").mkdir(parents=True)
    (tmp_path / "zero" / "config.pbtxt").symlink_to("/dev/zero")
    for name, words in (("fifo", "is not a regular file"), ("zero", "leads outside the model folder")):
        result = run_validate(tmp_path / name)  # before the fix: blocked on the FIFO, or read /dev/zero forever
        assert result.returncode == 1, (name, result.stdout, result.stderr)
        assert f"error: {tmp_path / name / 'config.pbtxt'}: the model config 'config.pbtxt'" in result.stderr
        assert words in result.stderr, (name, result.stderr)


def test_validate_refuses_an_integer_past_64_bits_with_an_error_line(tmp_path: Path) -> None:
    add_model(tmp_path, "huge", config(extra=f"optimization {{ z: 0x{'f' * 5000} }}\n").replace('"m"', '"huge"'),
              {1: mlp_weights()})
    result = run_validate(tmp_path / "huge")  # before: a traceback (the kept value was not printable as JSON)
    assert result.returncode == 1, result.stdout
    assert f"error: {tmp_path / 'huge' / 'config.pbtxt'}:6:19: number 0xffffffffff...(5002 digits) of field 'z' is " \
           "out of range" in result.stderr, result.stderr


def _reshaped(kind: str, dims: str, shape: str) -> str:
    return (f'name: "m"\nmax_batch_size: 8\n{kind} [ {{ name: "t", data_type: TYPE_FP32, dims: {dims} '
            f'reshape: {{ shape: {shape} }} }} ]\n')


@pytest.mark.parametrize("kind", ["input", "output"])
@pytest.mark.parametrize(("dims", "shape", "words"), [
    ("[ 3, 3 ]", "[ 10 ]", "holds another number of elements"),
    ("[ 63 ]", "[ 64 ]", "holds another number of elements"),
    ("[ 2 ]", "[ ]", "holds another number of elements"),
    ("[ -1, 4 ]", "[ 8 ]", "has another number of variable-size (-1) dimensions"),
    ("[ 16 ]", "[ -1, 4 ]", "has another number of variable-size (-1) dimensions"),
    ("[ 2, 4, -1, 6 ]", "[ 8, -1, 2, 6 ]", "holds another number of elements"),
])
def test_a_reshape_that_changes_the_element_count_is_refused_naming_the_tensor(kind: str, dims: str, shape: str,
                                                                              words: str) -> None:
    with pytest.raises(ModelConfigError) as caught:
        check_reshapes(parse_model_config(_reshaped(kind, dims, shape)), PATH)
    assert str(caught.value).startswith(f"{PATH}: {kind} 't': field 'reshape' shape "), caught.value
    assert words in str(caught.value)


@pytest.mark.parametrize(("dims", "shape"), [
    ("[ 3, 3 ]", "[ 9 ]"), ("[ 1 ]", "[ ]"), ("[ 1, 1 ]", "[ ]"), ("[ 2, 4, -1, 6 ]", "[ 8, -1, 1, 6 ]"),
    ("[ -1 ]", "[ -1, 1 ]"), ("[ 64 ]", "[ 8, 8 ]"),
])
def test_a_reshape_that_keeps_the_element_count_passes(dims: str, shape: str) -> None:
    for kind in ("input", "output"):
        check_reshapes(parse_model_config(_reshaped(kind, dims, shape)), PATH)


def test_validate_exits_1_on_an_output_reshape_of_another_size(tmp_path: Path) -> None:
    text = config().replace('dims: [ 10 ] }', 'dims: [ 3, 3 ] reshape: { shape: [ 10 ] } }').replace('"m"', '"rs3"')
    add_model(tmp_path, "rs3", text, {1: mlp_weights()})
    result = run_validate(tmp_path / "rs3")  # before: "ok", and every infer of the loaded model was a 500
    assert result.returncode == 1, result.stdout
    assert "output 'output': field 'reshape' shape [10] holds another number of elements than dims [3, 3]" in \
        result.stderr, result.stderr


@pytest.mark.parametrize("tensor", ["input", "output"])
def test_an_empty_reshape_of_a_non_batching_model_is_refused_as_triton_does(tensor: str) -> None:
    # a non-batching model's tensor reshaped to a scalar would carry no batch dimension to hold it; before, it loaded
    text = (f'name: "m"\nmax_batch_size: 0\n{tensor} [ {{ name: "t", data_type: TYPE_FP32, dims: [ 1 ], reshape: {{ '
            'shape: [ ] } } ]\n')
    with pytest.raises(ModelConfigError, match=rf"^/repo/m/config\.pbtxt: {tensor} 't': field 'reshape' is empty "
                                               r"\(a scalar\), which a non-batching model \(max_batch_size 0\) "
                                               "cannot have"):
        check_reshapes(parse_model_config(text), PATH)
    check_reshapes(parse_model_config(text.replace("max_batch_size: 0", "max_batch_size: 4")), PATH)

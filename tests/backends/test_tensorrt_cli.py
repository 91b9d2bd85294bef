"""`edged build-engine` arguments, shape specs, the reproducing command, and the backend without TensorRT."""

from __future__ import annotations

import argparse
import importlib.util
import io
import subprocess
import sys
from pathlib import Path

import pytest

from edged.backends._trt_build import elapsed_ticker, phase_line
from edged.backends._trt_buildspec import BuildSpec, ShapeSpec, parse_shape_spec, resolve_profile
from edged.backends.tensorrt import TensorRTBackend
from edged.cli import build_engine
from edged.errors import BackendUnavailable, ConfigError
from edged.repository.model_config import ModelConfig

needs_no_tensorrt = pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None,
                                       reason="TensorRT is installed here")


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="edged")
    build_engine.register(root.add_subparsers(dest="command"))
    return root


def test_full_shape_spec() -> None:
    spec = parse_shape_spec("images:min=1x3x224x224,opt=4x3x224x224,max=8x3x224x224")
    assert spec == ShapeSpec("images", (1, 3, 224, 224), (4, 3, 224, 224), (8, 3, 224, 224))
    assert parse_shape_spec(spec.as_text()) == spec


def test_fixed_shape_spec_and_names_with_colons() -> None:
    assert parse_shape_spec("input:0:1x3x8x8") == ShapeSpec("input:0", (1, 3, 8, 8), (1, 3, 8, 8), (1, 3, 8, 8))


@pytest.mark.parametrize(("text", "message"), [
    ("1x3x224x224", "expected NAME:min="),
    ("x:min=1x3,opt=2x3", "missing max"),
    ("x:min=1x3,opt=2x3,max=2x3,max=4x3", "once each"),
    ("x:min=1x3,opt=2x3,max=4", "same rank"),
    ("x:min=4x3,opt=2x3,max=8x3", "min <= opt <= max in every dimension, found 4, 2, 8"),
    ("x:1x-3", "expected dimensions like 1x3x224x224, found '1x-3'"),
])
def test_bad_shape_specs_say_what_was_expected(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        parse_shape_spec(text)


def test_profile_needs_a_spec_for_every_dynamic_input_and_only_for_inputs() -> None:
    inputs = {"images": (-1, 3, 224, 224), "scale": (1,)}
    chosen = resolve_profile(inputs, [parse_shape_spec("images:min=1x3x224x224,opt=2x3x224x224,max=4x3x224x224")])
    assert list(chosen) == ["images"]
    with pytest.raises(ConfigError, match=r"input 'images' has dynamic shape \[-1, 3, 224, 224\]: give --shapes"):
        resolve_profile(inputs, [])
    with pytest.raises(ConfigError, match="'imgs', which is not a network input"):
        resolve_profile(inputs, [parse_shape_spec("imgs:1x3x224x224")])
    with pytest.raises(ConfigError, match="does not fit input 'images'"):
        resolve_profile(inputs, [parse_shape_spec("images:min=1x3x320x320,opt=1x3x320x320,max=1x3x320x320")])


def test_arguments_become_a_spec_with_default_output_and_reproducing_command(tmp_path: Path) -> None:
    onnx = tmp_path / "det.onnx"
    onnx.write_bytes(b"onnx")
    args = parser().parse_args(["build-engine", str(onnx), "--precision", "fp32", "--workspace", "512",
                                "--shapes", "images:min=1x3x8x8,opt=2x3x8x8,max=4x3x8x8"])
    spec = build_engine.spec_from_args(args)
    assert spec.output == tmp_path / "model.plan"
    assert spec.command() == ("edged", "build-engine", str(onnx), "--output", str(tmp_path / "model.plan"),
                              "--precision", "fp32", "--workspace", "512",
                              "--shapes", "images:min=1x3x8x8,opt=2x3x8x8,max=4x3x8x8")
    assert spec.flags()["shapes"] == ["images:min=1x3x8x8,opt=2x3x8x8,max=4x3x8x8"]
    assert args.handler is build_engine.handle


def test_argument_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"onnx")
    for bad in (["--precision", "int4"], ["--workspace", "0"], ["--shapes", "x:1x"]):
        with pytest.raises(SystemExit):
            parser().parse_args(["build-engine", str(onnx), *bad])
    assert "expected dimensions like" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="--calibration-cache is for --precision int8"):
        BuildSpec(onnx, onnx.with_suffix(".plan"), "fp16", calibration_cache=onnx)
    args = parser().parse_args(["build-engine", str(tmp_path / "absent.onnx")])
    with pytest.raises(ConfigError, match=r"absent\.onnx: expected a file, found none"):
        build_engine.spec_from_args(args)
    args = parser().parse_args(["build-engine", str(onnx), "--shapes", "x:1x2", "--shapes", "x:1x3"])
    with pytest.raises(ConfigError, match=r"more than once for \['x'\]"):
        build_engine.spec_from_args(args)


def test_help_documents_the_shape_style() -> None:
    text = parser()._subparsers._group_actions[0].choices["build-engine"].format_help()  # type: ignore[union-attr]
    assert "images:min=1x3x640x640,opt=4x3x640x640,max=8x3x640x640" in text
    assert "--system-site-packages" in text


@needs_no_tensorrt
def test_build_without_tensorrt_says_how_to_get_it(tmp_path: Path) -> None:
    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"onnx")
    with pytest.raises(BackendUnavailable, match=r"python3-libnvinfer.*--system-site-packages"):
        build_engine.handle(parser().parse_args(["build-engine", str(onnx)]))
    assert not (tmp_path / "model.plan").exists()


def test_progress_lines_and_elapsed_ticker() -> None:
    assert phase_line("Building engine", 3, 10, 1, 12.34) == "[  12.3s]   Building engine 3/10"
    assert phase_line("Parsing", 0, 0, 0, 0.0) == "[   0.0s] Parsing"
    out = io.StringIO()
    with elapsed_ticker(out, every=0.01):
        import time
        time.sleep(0.05)
    assert "building ..." in out.getvalue()


@needs_no_tensorrt
def test_backend_without_tensorrt(tmp_path: Path) -> None:
    backend = TensorRTBackend()
    info = backend.runtime_info()
    assert info["tensorrt"] == "not installed"
    assert "cuda" in info and "scratch_arena" in info
    with pytest.raises(BackendUnavailable, match="TensorRT is not installed"):
        backend.load(tmp_path / "model.plan", ModelConfig(name="m", backend="tensorrt"), 0)
    with pytest.raises(BackendUnavailable, match="python3-libnvinfer"):
        backend.describe(tmp_path / "model.plan")


def test_importing_the_backend_and_command_imports_no_runtime() -> None:
    code = ("import sys, edged.backends.tensorrt, edged.cli.build_engine; "
            "print([m for m in ('tensorrt', 'cuda', 'torch') if m in sys.modules])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"

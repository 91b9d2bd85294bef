"""``edged build-engine``: build a TensorRT engine from an ONNX model on this device, with its sidecar.

Engines are tied to the TensorRT version and GPU they were built with, so they are built on the target. The
sidecar (``model.plan.json``) records both, plus the command below, which the daemon quotes when it refuses
an engine built elsewhere.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from edged.backends._trt_buildspec import PRECISIONS, BuildSpec, ShapeSpec, default_output, parse_shape_spec
from edged.errors import ConfigError

DESCRIPTION = """\
Build a TensorRT engine (model.plan) from an ONNX model, on the device that will run it, and record the
TensorRT version, GPU, L4T release and build flags beside it in model.plan.json.

Dynamic inputs need one --shapes per input, giving the optimisation profile:
  --shapes images:min=1x3x640x640,opt=4x3x640x640,max=8x3x640x640
A fixed shape can be given alone (min = opt = max):
  --shapes images:1x3x640x640
The input name is everything before the last ':' (names such as input:0 work).

Needs TensorRT's Python bindings: on a Jetson they come from JetPack (python3-libnvinfer) for the system
Python, so edged's virtualenv must be created with --system-site-packages.
"""


def _shape(text: str) -> ShapeSpec:
    try:
        return parse_shape_spec(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a whole number of MiB, found {text!r}") from e
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of MiB, found {value}")
    return value


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "build-engine", help="build a TensorRT engine from an ONNX model on this device",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("onnx", type=Path, help="the ONNX model")
    parser.add_argument("--output", type=Path, default=None,
                        help="where to write the engine (default: model.plan next to the ONNX model)")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp16",
                        help="fp16 (default; FP32 where faster), fp32, or int8 (with FP16 fallback)")
    parser.add_argument("--calibration-cache", type=Path, default=None, metavar="FILE",
                        help="INT8 calibration cache (from trtexec or a calibrator); --precision int8 only")
    parser.add_argument("--workspace", type=_positive_int, default=None, metavar="MB",
                        help="builder workspace limit in MiB (default: TensorRT's, the device memory)")
    parser.add_argument("--shapes", type=_shape, action="append", default=[], metavar="NAME:SPEC",
                        help="optimisation profile of one input: NAME:min=AxB,opt=AxB,max=AxB or NAME:AxB "
                             "(repeat per input)")
    parser.set_defaults(handler=handle)


def spec_from_args(args: argparse.Namespace) -> BuildSpec:
    onnx: Path = args.onnx
    if not onnx.is_file():
        raise ConfigError(f"ONNX model {onnx}: expected a file, found none")
    if args.calibration_cache is not None and not args.calibration_cache.is_file():
        raise ConfigError(f"--calibration-cache {args.calibration_cache}: expected a file, found none")
    names = [s.name for s in args.shapes]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ConfigError(f"--shapes given more than once for {duplicated}")
    return BuildSpec(onnx=onnx, output=args.output or default_output(onnx), precision=args.precision,
                     calibration_cache=args.calibration_cache, workspace_mb=args.workspace,
                     shapes=tuple(args.shapes))


def _report(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def handle(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    from edged.backends._trt_build import build_engine

    result = build_engine(spec, _report)
    for warning in result.warnings:
        _report(f"TensorRT: {warning}")
    print(f"wrote {result.plan} ({result.size / 2**20:.1f} MiB, {result.seconds:.0f}s) and {result.sidecar}")
    return 0

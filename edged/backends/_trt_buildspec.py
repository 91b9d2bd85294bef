"""What `edged build-engine` is asked to build, as values: shape specs, precision, the reproducing command.

Pure: parsing and validation only. Shapes use one flag per input with all three profile shapes,
``NAME:min=1x3x224x224,opt=4x3x224x224,max=8x3x224x224``, or ``NAME:1x3x224x224`` for a fixed shape. The name
is everything before the last ':' so TensorFlow-style names ("input:0") work.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from edged.errors import ConfigError

Precision = Literal["fp32", "fp16", "int8"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "fp16", "int8")
_DIMS = re.compile(r"^\d+(x\d+)*$")
Shape = tuple[int, ...]


@dataclass(frozen=True)
class ShapeSpec:
    name: str
    min: Shape
    opt: Shape
    max: Shape

    def as_text(self) -> str:
        def dims(shape: Shape) -> str:
            return "x".join(str(d) for d in shape)

        if self.min == self.opt == self.max:
            return f"{self.name}:{dims(self.opt)}"
        return f"{self.name}:min={dims(self.min)},opt={dims(self.opt)},max={dims(self.max)}"


def parse_dims(text: str, where: str) -> Shape:
    if not _DIMS.match(text):
        raise ConfigError(f"{where}: expected dimensions like 1x3x224x224, found {text!r}")
    return tuple(int(d) for d in text.split("x"))


def parse_shape_spec(text: str) -> ShapeSpec:
    name, sep, body = text.rpartition(":")
    if not sep or not name:
        raise ConfigError(f"--shapes {text!r}: expected NAME:min=AxB,opt=AxB,max=AxB or NAME:AxB")
    where = f"--shapes {text!r}"
    if "=" not in body:
        shape = parse_dims(body, where)
        return ShapeSpec(name, shape, shape, shape)
    parts: dict[str, Shape] = {}
    for item in body.split(","):
        key, eq, value = item.partition("=")
        if not eq or key not in ("min", "opt", "max") or key in parts:
            raise ConfigError(f"{where}: expected min=, opt= and max= once each, found {item!r}")
        parts[key] = parse_dims(value, where)
    missing = [k for k in ("min", "opt", "max") if k not in parts]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}")
    spec = ShapeSpec(name, parts["min"], parts["opt"], parts["max"])
    check_shape_spec(spec)
    return spec


def check_shape_spec(spec: ShapeSpec) -> None:
    if not len(spec.min) == len(spec.opt) == len(spec.max):
        raise ConfigError(f"--shapes {spec.as_text()}: min, opt and max must have the same rank, found "
                          f"{len(spec.min)}, {len(spec.opt)} and {len(spec.max)}")
    for lo, mid, hi in zip(spec.min, spec.opt, spec.max, strict=True):
        if not lo <= mid <= hi:
            raise ConfigError(f"--shapes {spec.as_text()}: expected min <= opt <= max in every dimension, "
                              f"found {lo}, {mid}, {hi}")


def resolve_profile(network_inputs: Mapping[str, Shape], specs: Sequence[ShapeSpec]) -> dict[str, ShapeSpec]:
    """Match specs to the network's inputs: every dynamic input needs one; each spec must fit its input."""
    by_name = {s.name: s for s in specs}
    problems = [f"--shapes names {s.name!r}, which is not a network input (inputs: {sorted(network_inputs)})"
                for s in specs if s.name not in network_inputs]
    for name, shape in network_inputs.items():
        spec = by_name.get(name)
        if spec is None:
            if any(d < 0 for d in shape):
                problems.append(f"input {name!r} has dynamic shape {list(shape)}: give --shapes "
                                f"{name}:min=...,opt=...,max=...")
            continue
        if len(spec.min) != len(shape) or any(
                d >= 0 and not (lo == d == hi) for d, lo, hi in zip(shape, spec.min, spec.max, strict=False)):
            problems.append(f"--shapes {spec.as_text()} does not fit input {name!r} of shape {list(shape)}")
    if problems:
        raise ConfigError("; ".join(problems))
    return {name: by_name[name] for name in network_inputs if name in by_name}


@dataclass(frozen=True)
class BuildSpec:
    onnx: Path
    output: Path
    precision: Precision = "fp16"
    calibration_cache: Path | None = None
    workspace_mb: int | None = None
    shapes: tuple[ShapeSpec, ...] = ()

    def __post_init__(self) -> None:
        if self.calibration_cache is not None and self.precision != "int8":
            raise ConfigError(f"--calibration-cache is for --precision int8, found --precision "
                              f"{self.precision}")
        if self.workspace_mb is not None and self.workspace_mb <= 0:
            raise ConfigError(f"--workspace: expected a positive number of MiB, found {self.workspace_mb}")

    def command(self) -> tuple[str, ...]:
        """The command line that rebuilds exactly this engine (absolute paths, every flag explicit)."""
        args = ["edged", "build-engine", str(self.onnx.resolve()), "--output", str(self.output.resolve()),
                "--precision", self.precision]
        if self.calibration_cache is not None:
            args += ["--calibration-cache", str(self.calibration_cache.resolve())]
        if self.workspace_mb is not None:
            args += ["--workspace", str(self.workspace_mb)]
        for spec in self.shapes:
            args += ["--shapes", spec.as_text()]
        return tuple(args)

    def flags(self) -> dict[str, Any]:
        return {"precision": self.precision, "workspace_mb": self.workspace_mb,
                "calibration_cache": str(self.calibration_cache) if self.calibration_cache else None,
                "shapes": [s.as_text() for s in self.shapes], "version_compatible": False}


def default_output(onnx: Path) -> Path:
    """``model.plan`` in the ONNX file's directory, where the repository layout expects it."""
    return onnx.with_name("model.plan")

"""Engines built during staging: a model bundle may carry an ONNX model plus ``build_spec.json`` in its version
folder instead of a ``.plan``, because a plan is tied to the GPU and the TensorRT version it was built with.

Invariants: the spec is validated in full before the builder starts (known keys only, a precision TensorRT
knows, shapes in `edged build-engine` syntax, every file it names inside the version folder, a model whose
config.pbtxt says TensorRT); the engine is written into the staging copy only, so a failed build leaves nothing
served; any failure refuses the update with the builder's reason. The builder is the one `edged build-engine`
uses (`edged.backends._trt_build.build_engine`), imported when a build starts: TensorRT stays optional.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from edged.backends._trt_buildspec import PRECISIONS, BuildSpec, Precision, ShapeSpec, parse_shape_spec
from edged.errors import ConfigError, UpdateRejected
from edged.repository import confined_path, load_model_config

log = logging.getLogger(__name__)
BUILD_SPEC = "build_spec.json"
SPEC_KEYS = ("onnx", "precision", "shapes", "workspace_mb", "calibration_cache")
Builder = Callable[[BuildSpec, Callable[[str], None]], object]


def read_build_spec(staged_model: Path, version: int) -> BuildSpec | None:
    """The staged version's build spec as a `BuildSpec` (None when the bundle has none); refused when invalid."""
    path = staged_model / str(version) / BUILD_SPEC
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_bytes())
    except ValueError as e:
        raise UpdateRejected(f"{BUILD_SPEC}: not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise UpdateRejected(f"{BUILD_SPEC}: expected an object with keys {', '.join(SPEC_KEYS)}")
    try:
        return _spec(staged_model, version, doc)
    except ConfigError as e:
        raise UpdateRejected(f"{BUILD_SPEC}: {e}") from e


def check_build_spec(raw: bytes) -> None:
    """On the operator's workstation: what can be checked without the device (keys, precision, shapes)."""
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise UpdateRejected(f"--build-spec: not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise UpdateRejected(f"--build-spec: expected an object with keys {', '.join(SPEC_KEYS)}")
    try:
        _check_keys(doc)
        _precision(doc)
        _shapes(doc)
    except ConfigError as e:
        raise UpdateRejected(f"--build-spec: {e}") from e


def _check_keys(doc: dict[str, Any]) -> None:
    unknown = sorted(set(doc) - set(SPEC_KEYS))
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r} (known: {', '.join(SPEC_KEYS)})")


def _precision(doc: dict[str, Any]) -> Precision:
    precision = doc.get("precision", "fp16")
    if precision not in PRECISIONS:
        raise ConfigError(f"precision: expected one of {', '.join(PRECISIONS)}, found {precision!r}")
    return cast("Precision", precision)


def _shapes(doc: dict[str, Any]) -> tuple[ShapeSpec, ...]:
    shapes = doc.get("shapes", [])
    if not isinstance(shapes, list) or not all(isinstance(s, str) for s in shapes):
        raise ConfigError(f"shapes: expected a list of NAME:min=AxB,opt=AxB,max=AxB strings, found {shapes!r}")
    return tuple(parse_shape_spec(s) for s in shapes)


def _spec(staged_model: Path, version: int, doc: dict[str, Any]) -> BuildSpec:
    _check_keys(doc)
    config = load_model_config(staged_model)
    if config is None or config.runtime != "tensorrt":
        found = f"platform {config.platform!r}, backend {config.backend!r}" if config else "no config.pbtxt"
        raise ConfigError(f"an engine is built only for a TensorRT model (platform \"tensorrt_plan\"), found {found}")
    precision, shapes = _precision(doc), _shapes(doc)
    workspace = doc.get("workspace_mb")
    if workspace is not None and (not isinstance(workspace, int) or isinstance(workspace, bool)):
        raise ConfigError(f"workspace_mb: expected a whole number of MiB, found {workspace!r}")
    under = str(version)
    onnx = confined_path(staged_model, str(doc.get("onnx", "model.onnx")), "onnx", under=under)
    cache = doc.get("calibration_cache")
    return BuildSpec(onnx=onnx, output=confined_path(staged_model, config.model_filename, "the engine", under=under,
                                                     must_exist=False),
                     precision=precision, workspace_mb=workspace, shapes=shapes,
                     calibration_cache=None if cache is None else confined_path(staged_model, str(cache),
                                                                                "calibration_cache", under=under))


def build_staged_engine(staged_model: Path, model: str, version: int, builder: Builder | None = None) -> bool:
    """Builds the engine a staged version's spec asks for, into the staging copy; False when it has no spec."""
    spec = read_build_spec(staged_model, version)
    if spec is None:
        return False
    if builder is None:
        from edged.backends._trt_build import build_engine  # TensorRT is imported only when a build starts

        builder = build_engine

    def report(line: str) -> None:
        log.info("OTA: model %s version %d: engine build: %s", model, version, line)

    report(f"building {spec.output.name} from {spec.onnx.name} ({spec.precision})")
    try:
        builder(spec, report)
    except Exception as e:  # the builder runs foreign code (TensorRT's bindings): any failure refuses the update
        raise UpdateRejected(f"engine build on this device failed: {e}") from e
    if not spec.output.is_file():
        raise UpdateRejected(f"engine build on this device wrote no {spec.output.name}")
    return True

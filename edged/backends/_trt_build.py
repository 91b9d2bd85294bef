"""Building a TensorRT engine from ONNX, on the device that will run it, for `edged build-engine`.

The builder parses the ONNX file, adds one optimisation profile from the --shapes specs, sets precision
(int8 from a calibration cache, or Q/DQ nodes in the model) and workspace, and reports progress through an
``IProgressMonitor`` (TensorRT >= 10) or an elapsed-time ticker. The plan and its sidecar are written
atomically. TensorRT is imported only when a build starts.
"""

from __future__ import annotations

import hashlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from edged.backends._trt_buildspec import BuildSpec, Shape, resolve_profile
from edged.backends._trt_cuda import CudaError, load_cuda_api
from edged.backends._trt_meta import (
    EngineMeta,
    TrtCapabilities,
    read_l4t_release,
    write_file_atomically,
    write_sidecar,
)
from edged.backends._trt_runtime import import_tensorrt, make_logger
from edged.errors import ModelError

Report = Callable[[str], None]


@dataclass(frozen=True)
class BuildResult:
    plan: Path
    sidecar: Path
    size: int
    seconds: float
    warnings: tuple[str, ...] = ()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def phase_line(phase: str, step: int, steps: int, depth: int, elapsed: float) -> str:
    indent = "  " * depth
    count = f" {step}/{steps}" if steps > 0 else ""
    return f"[{elapsed:6.1f}s] {indent}{phase}{count}"


def make_progress_monitor(trt: Any, report: Report, max_depth: int = 1) -> Any:
    """An ``IProgressMonitor`` that reports phases (and steps of the top ones); never cancels the build."""
    started = time.monotonic()

    class Monitor(trt.IProgressMonitor):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self._depth: dict[str, int] = {}
            self._steps: dict[str, int] = {}

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            depth = self._depth.get(parent_phase, -1) + 1 if parent_phase else 0
            self._depth[phase_name] = depth
            self._steps[phase_name] = num_steps
            if depth <= max_depth:
                report(phase_line(phase_name, 0, num_steps, depth, time.monotonic() - started))

        def step_complete(self, phase_name: str, step: int) -> bool:
            depth = self._depth.get(phase_name, 0)
            if depth == 0:
                report(phase_line(phase_name, step + 1, self._steps.get(phase_name, 0), depth,
                                  time.monotonic() - started))
            return True

        def phase_finish(self, phase_name: str) -> None:
            self._depth.pop(phase_name, None)
            self._steps.pop(phase_name, None)

    return Monitor()


@contextmanager
def elapsed_ticker(stream: TextIO, every: float = 5.0) -> Iterator[None]:
    """For TensorRT < 10: a line with the elapsed time every few seconds while the build blocks."""
    stop = threading.Event()
    started = time.monotonic()

    def tick() -> None:
        while not stop.wait(every):
            print(f"[{time.monotonic() - started:6.1f}s] building ...", file=stream, flush=True)

    thread = threading.Thread(target=tick, name="build-engine-ticker", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _calibrator(trt: Any, cache: bytes) -> Any:
    base = getattr(trt, "IInt8EntropyCalibrator2", None)
    if base is None:
        raise ModelError(f"TensorRT {trt.__version__} has no IInt8EntropyCalibrator2: calibration caches are "
                         f"not supported; use an ONNX model with Q/DQ nodes and --precision int8")

    class CacheCalibrator(base):  # type: ignore[misc,valid-type]
        """Replays a calibration cache; never asks for data."""

        def __init__(self) -> None:
            super().__init__()

        def get_batch_size(self) -> int:
            return 1

        def get_batch(self, names: Any) -> None:
            return None

        def read_calibration_cache(self) -> bytes:
            return cache

        def write_calibration_cache(self, data: Any) -> None:
            return None

    return CacheCalibrator()


def _parse(trt: Any, caps: TrtCapabilities, builder: Any, logger: Any, onnx: Path) -> tuple[Any, Any]:
    flags = 0 if caps.major >= 10 else 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)] + logger.drain()
        raise ModelError(f"TensorRT could not parse {onnx}: " + " | ".join(errors or ["no details"]))
    return network, parser


def _configure(trt: Any, builder: Any, network: Any, spec: BuildSpec, report: Report) -> Any:
    config = builder.create_builder_config()
    if spec.workspace_mb is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, spec.workspace_mb << 20)
    if spec.precision in ("fp16", "int8"):
        if not builder.platform_has_fast_fp16:
            report("warning: this GPU has no fast FP16; FP16 kernels may be slower than FP32")
        config.set_flag(trt.BuilderFlag.FP16)
    if spec.precision == "int8":
        config.set_flag(trt.BuilderFlag.INT8)
        if spec.calibration_cache is not None:
            config.int8_calibrator = _calibrator(trt, spec.calibration_cache.read_bytes())
        else:
            report("note: int8 without --calibration-cache needs Q/DQ nodes in the ONNX model")
    inputs: dict[str, Shape] = {}
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        inputs[tensor.name] = tuple(int(d) for d in tensor.shape)
    chosen = resolve_profile(inputs, spec.shapes)
    if chosen:
        profile = builder.create_optimization_profile()
        for name, shape in chosen.items():
            profile.set_shape(name, shape.min, shape.opt, shape.max)
        config.add_optimization_profile(profile)
        set_calibration_profile = getattr(config, "set_calibration_profile", None)
        if spec.calibration_cache is not None and set_calibration_profile is not None:
            set_calibration_profile(profile)
    return config


def build_engine(spec: BuildSpec, report: Report, stream: TextIO = sys.stderr) -> BuildResult:
    trt = import_tensorrt()
    caps = TrtCapabilities.from_version(str(trt.__version__))
    try:
        props = load_cuda_api().device_properties(0)
    except CudaError as e:
        raise ModelError(f"no usable CUDA device to build on: {e}") from e
    logger = make_logger(trt, "WARNING")
    builder = trt.Builder(logger)
    network, _parser = _parse(trt, caps, builder, logger, spec.onnx)
    config = _configure(trt, builder, network, spec, report)
    report(f"building {spec.onnx} with TensorRT {caps.version} on {props.name} "
           f"(compute {props.compute_capability}), precision {spec.precision}")
    started = time.monotonic()
    if caps.progress_monitor and hasattr(trt, "IProgressMonitor"):
        config.progress_monitor = make_progress_monitor(trt, report)
        serialized = builder.build_serialized_network(network, config)
    else:
        with elapsed_ticker(stream):
            serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        details = " | ".join(logger.drain() or ["no details"])
        raise ModelError(f"TensorRT could not build {spec.onnx}: {details}")
    data = bytes(memoryview(serialized))
    write_file_atomically(spec.output, data)
    meta = EngineMeta(tensorrt_version=caps.version, device_name=props.name,
                      compute_capability=props.compute_capability, l4t_release=read_l4t_release(),
                      build_flags=spec.flags(), source_onnx_sha256=sha256_file(spec.onnx),
                      build_command=spec.command())
    sidecar = write_sidecar(spec.output, meta)
    return BuildResult(spec.output, sidecar, len(data), time.monotonic() - started, tuple(logger.drain()))

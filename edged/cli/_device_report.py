"""``edged doctor --device-report``: prove on a real device what the README says edged supports.

Each step runs for real where its hardware or tool exists and is recorded as ``skipped`` with the reason
where it does not, so a report from a CPU-only machine is honest about what it did not prove. The steps:
serve the bundled ONNX model with ONNX Runtime; build a TensorRT engine from it (the code of ``edged
build-engine``), serve it beside the ONNX Runtime version and compare their outputs; compare ONNX Runtime's
CUDA provider with its CPU one; read telemetry from every source the device has and check sysfs against
tegrastats; measure load/unload memory (MemAvailable: on Jetson's unified memory the GPU's allocations come
out of it too); run the ``hardware`` tests when a source checkout and pytest are there. One JSON file and a
readable summary beside it are written, to send back.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import shutil
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import edged
from edged.cli import _device_probes as probes
from edged.cli._device_probes import Status, Step, skipped
from edged.cli._doctor_checks import check_platform, is_jetson
from edged.config import ModelsConfig
from edged.daemon.paths import bundled_models
from edged.engine import InferenceService
from edged.engine.types import InferRequest
from edged.errors import EdgedError

MODEL = "digits_onnx"
TRT_MODEL = "digits_trt"
RUNS = 20
# fp16 engines differ from fp32 ONNX Runtime by rounding; the digits MLP's logits stay well inside this.
TRT_TOLERANCE = 5e-2


@dataclass
class Context:
    root: Path
    workdir: Path
    tests: Path | None
    inputs: np.ndarray
    outputs: dict[str, np.ndarray] = field(default_factory=dict)  # the reference outputs, per runtime
    plan: Path | None = None  # the TensorRT engine, once built


def collect(root: Path, workdir: Path, tests: Path | None) -> list[Step]:
    context = Context(root, workdir, tests, np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32))
    steps: list[Callable[[Context], Step | list[Step]]] = [
        platform_step, onnxruntime_step, tensorrt_step, onnxruntime_cuda_step, probes.telemetry_steps,
        memory_step, probes.hardware_tests_step]  # memory after tensorrt: it measures the engine too
    results: list[Step] = []
    for run in steps:
        try:
            outcome = run(context)
        except (EdgedError, ImportError, OSError, RuntimeError, ValueError) as e:  # that step's result only
            outcome = Step(run.__name__.removesuffix("_step"), "failed", f"{type(e).__name__}: {e}")
        results.extend(outcome if isinstance(outcome, list) else [outcome])
    return results


def platform_step(context: Context) -> Step:
    found = {check.name: check.detail for check in check_platform(context.root)}
    return Step("platform", "ok", found.get("module", "unknown module"),
                {"jetson": is_jetson(context.root), "checks": found, "machine": platform.machine(),
                 "kernel": platform.release(), "python": platform.python_version()})


def _repository(context: Context, with_engine: Path | None = None) -> Path:
    repo = context.workdir / ("repo-trt" if with_engine else "repo")
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(bundled_models() / MODEL, repo / MODEL)
    if with_engine is not None:
        (repo / TRT_MODEL / "1").mkdir(parents=True)
        shutil.copy2(with_engine, repo / TRT_MODEL / "1" / "model.plan")
        config = (repo / MODEL / "config.pbtxt").read_text()
        config = config.replace(f'name: "{MODEL}"', f'name: "{TRT_MODEL}"')
        config = config.replace('platform: "onnxruntime_onnx"', 'platform: "tensorrt_plan"')
        config = config.replace("kind: KIND_CPU", "kind: KIND_GPU").replace('label_filename: "labels.txt"', "")
        (repo / TRT_MODEL / "config.pbtxt").write_text(config)
    return repo


def _serve(service: InferenceService, model: str, inputs: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """The model's output for ``inputs`` and the median latency of RUNS requests."""
    latencies = []
    output = None
    for _ in range(RUNS):
        started = time.perf_counter()
        response = service.infer(InferRequest(model, {"input": inputs}), timeout_s=60)
        latencies.append((time.perf_counter() - started) * 1e3)
        output = response.outputs["output"]
    if output is None:
        raise RuntimeError(f"{model}: no output")
    instances = service.version_info(model).describe_instances()
    return np.asarray(output), {"median_ms": round(statistics.median(latencies), 3), "instances": instances}


def onnxruntime_step(context: Context) -> Step:
    service = InferenceService(_repository(context), ModelsConfig(warmup=False))
    try:
        service.start()
        output, timing = _serve(service, MODEL, context.inputs)
    finally:
        service.close(30)
    context.outputs["onnxruntime"] = output
    providers = [p for i in timing["instances"] for p in i.get("providers", [])]
    return Step("onnxruntime", "ok", f"served {MODEL} ({', '.join(providers) or 'default providers'}): "
                f"batch {len(context.inputs)}, median {timing['median_ms']} ms over {RUNS} requests",
                {**timing, "output_sha256": _digest(output), "output_row0": output[0].tolist()})


def tensorrt_step(context: Context) -> list[Step]:
    reason = probes.tensorrt_missing()
    if reason:
        return [skipped("tensorrt build", reason), skipped("tensorrt vs onnxruntime", reason)]
    from edged.backends._trt_build import build_engine
    from edged.backends._trt_buildspec import BuildSpec, parse_shape_spec

    plan = context.workdir / "digits.plan"
    spec = BuildSpec(onnx=bundled_models() / MODEL / "1" / "model.onnx", output=plan, precision="fp16",
                     shapes=(parse_shape_spec("input:min=1x64,opt=8x64,max=64x64"),))
    log: list[str] = []
    built = build_engine(spec, log.append)
    context.plan = plan
    build = Step("tensorrt build", "ok", f"built {plan.name} ({built.size} bytes) in {built.seconds:.1f} s",
                 {"seconds": built.seconds, "size": built.size, "warnings": list(built.warnings), "log": log})
    service = InferenceService(_repository(context, plan), ModelsConfig(warmup=False))
    try:
        service.start()
        trt_out, trt_timing = _serve(service, TRT_MODEL, context.inputs)
        ort_out, ort_timing = _serve(service, MODEL, context.inputs)
    finally:
        service.close(30)
    diff = float(np.max(np.abs(trt_out - ort_out)))
    same_class = bool(np.all(trt_out.argmax(axis=1) == ort_out.argmax(axis=1)))
    status: Status = "ok" if diff <= TRT_TOLERANCE and same_class else "failed"
    return [build, Step("tensorrt vs onnxruntime", status,
                        f"max |TensorRT - ONNX Runtime| = {diff:.2e} (tolerance {TRT_TOLERANCE}), same classes: "
                        f"{same_class}; median {trt_timing['median_ms']} ms vs {ort_timing['median_ms']} ms",
                        {"max_abs_diff": diff, "same_classes": same_class, "tensorrt": trt_timing,
                         "onnxruntime": ort_timing})]


def onnxruntime_cuda_step(context: Context) -> Step:
    if importlib.util.find_spec("onnxruntime") is None:
        return skipped("onnxruntime cuda", "onnxruntime is not installed (pip install edged[onnx])")
    import onnxruntime

    available = onnxruntime.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        return skipped("onnxruntime cuda", f"CUDAExecutionProvider not available (providers: {available})")
    model = str(bundled_models() / MODEL / "1" / "model.onnx")
    outputs = {}
    for provider in ("CUDAExecutionProvider", "CPUExecutionProvider"):
        session = onnxruntime.InferenceSession(model, providers=[provider])
        outputs[provider] = np.asarray(session.run(None, {"input": context.inputs})[0])
    diff = float(np.max(np.abs(outputs["CUDAExecutionProvider"] - outputs["CPUExecutionProvider"])))
    status: Status = "ok" if diff <= TRT_TOLERANCE else "failed"
    return Step("onnxruntime cuda", status, f"max |CUDA - CPU| = {diff:.2e}", {"max_abs_diff": diff})


def memory_step(context: Context) -> list[Step]:
    """MemAvailable and this process's RSS before a load, after it, and after the unload, per runtime."""
    repo = _repository(context, context.plan)
    models = [MODEL] + ([TRT_MODEL] if context.plan is not None else [])
    service = InferenceService(repo, ModelsConfig(warmup=False, control_mode="explicit"))
    try:
        service.start()  # explicit mode: nothing loads until asked
        return [_measure(service, context, model) for model in models]
    finally:
        service.close(30)


def _measure(service: InferenceService, context: Context, model: str) -> Step:
    points: dict[str, dict[str, int]] = {"before": probes.memory_now(context.root)}
    service.load_model(model)
    service.infer(InferRequest(model, {"input": context.inputs}), timeout_s=60)
    points["loaded"] = probes.memory_now(context.root)
    service.unload_model(model)
    points["unloaded"] = probes.memory_now(context.root)
    load = points["before"]["mem_available_kib"] - points["loaded"]["mem_available_kib"]
    kept = points["before"]["mem_available_kib"] - points["unloaded"]["mem_available_kib"]
    name = "memory" if model == MODEL else f"memory {model}"
    return Step(name, "ok", f"loading {model} took {load / 1024:.1f} MiB of MemAvailable, "
                f"{kept / 1024:.1f} MiB not returned after the unload (RSS {points['before']['rss_kib'] // 1024}"
                f" -> {points['loaded']['rss_kib'] // 1024} -> {points['unloaded']['rss_kib'] // 1024} MiB)",
                {"points": points, "load_kib": load, "not_returned_kib": kept})


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def write_report(steps: list[Step], path: Path) -> tuple[Path, Path]:
    """The JSON report at ``path`` and its readable summary beside it (``.txt``), written atomically."""
    counts = {status: sum(1 for s in steps if s.status == status) for status in ("ok", "failed", "skipped")}
    document = {"edged_version": edged.__version__, "host": socket.gethostname(),
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "summary": counts,
                "steps": [asdict(step) for step in steps]}
    summary = path.with_suffix(".txt")
    _write(path, json.dumps(document, indent=2, default=str) + "\n")
    lines = [f"edged {edged.__version__} device report, {document['host']}, {document['created']}",
             f"{counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped", ""]
    lines += [f"{step.status.upper():<8} {step.name:<30} {step.detail}" for step in steps]
    _write(summary, "\n".join(lines) + "\n")
    return path, summary


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(handle.name, path)

"""ONNX Runtime backend: TensorRT, CUDA and CPU execution providers chosen from the model's config.

Providers come from ``parameters { key: "providers" ... }`` ("tensorrt,cuda,cpu") or, as in Triton, from
``instance_group { kind: KIND_GPU }`` and ``optimization { execution_accelerators { ... } }``. A requested
provider that is unavailable fails the load unless ``allow_provider_fallback`` is "true"; then the fallback is
logged and reported in the instance info. Sessions are created from a path, never from bytes (bytes stay
alive as a copy, about +50 MiB for a 53 MB model: docs/field-notes.md).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends._ort_binding import Bindings
from edged.backends._threads import thread_count
from edged.backends.base import Array, InstanceInfo
from edged.errors import BackendUnavailable, InferenceFailed, InvalidInput, ModelLoadError
from edged.repository import not_a_tensor
from edged.repository.model_config import UNSUPPORTED, ModelConfig, ModelSignature, TensorSignature

log = logging.getLogger(__name__)

ORT_TO_TRITON: dict[str, str] = {
    "tensor(bool)": "TYPE_BOOL", "tensor(uint8)": "TYPE_UINT8", "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32", "tensor(uint64)": "TYPE_UINT64", "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16", "tensor(int32)": "TYPE_INT32", "tensor(int64)": "TYPE_INT64",
    "tensor(float16)": "TYPE_FP16", "tensor(float)": "TYPE_FP32", "tensor(double)": "TYPE_FP64",
    "tensor(string)": "TYPE_STRING", "tensor(bfloat16)": "TYPE_BF16",
}
_OPTIONAL_TENSOR = re.compile(r"optional\((tensor\(\w+\))\)")
PROVIDER_NAMES: dict[str, str] = {
    "tensorrt": "TensorrtExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "cpu": "CPUExecutionProvider",
}


def _import_ort() -> Any:
    try:
        import onnxruntime
    except ImportError as e:
        raise BackendUnavailable(
            "onnxruntime is not installed: install edged with the 'onnx' extra (pip install 'edged[onnx]'); "
            "on a Jetson use NVIDIA's onnxruntime-gpu build for your JetPack") from e
    return onnxruntime


def _flag(parameters: Mapping[str, str], key: str, default: bool) -> bool:
    value = parameters.get(key)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ModelLoadError(f"parameter {key}: expected true or false, found {value!r}")


def _int_param(parameters: Mapping[str, str], key: str, default: int) -> int:
    value = parameters.get(key)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ModelLoadError(f"parameter {key}: expected an integer, found {value!r}") from None


@dataclass(frozen=True)
class ProviderPlan:
    requested: tuple[str, ...]  # short names in order of preference: tensorrt, cuda, cpu
    allow_fallback: bool


def plan_providers(config: ModelConfig) -> ProviderPlan:
    """Decide which execution providers a config asks for (pure; tested without GPUs)."""
    params = config.parameters
    if "providers" in params:
        names = tuple(p.strip().lower() for p in params["providers"].split(",") if p.strip())
        unknown = [n for n in names if n not in PROVIDER_NAMES]
        if unknown:
            raise ModelLoadError(f"model {config.name}: parameter providers: unknown provider {unknown[0]!r} "
                                 f"(known: {', '.join(PROVIDER_NAMES)})")
    else:
        names = _providers_from_triton_fields(config)
    if "cpu" not in names and not names:
        names = ("cpu",)
    return ProviderPlan(names, _flag(params, "allow_provider_fallback", False))


def _providers_from_triton_fields(config: ModelConfig) -> tuple[str, ...]:
    gpu = any(group.kind == "KIND_GPU" for group in config.instance_group)
    accelerators = config.optimization.get("execution_accelerators", {})
    gpu_accels = accelerators.get("gpu_execution_accelerator", []) if isinstance(accelerators, dict) else []
    if isinstance(gpu_accels, dict):
        gpu_accels = [gpu_accels]
    names: list[str] = []
    if gpu and any(isinstance(a, dict) and a.get("name") == "tensorrt" for a in gpu_accels):
        names.append("tensorrt")
    if gpu:
        names.append("cuda")
    names.append("cpu")
    return tuple(names)


class OnnxRuntimeBackend:
    name = "onnxruntime"

    def describe(self, model_path: Path) -> ModelSignature:
        ort = _import_ort()
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 3  # errors only, as for serving sessions: warnings went to stderr in colour
        session = _create_session(ort, model_path, options, ["CPUExecutionProvider"], [{}])
        return ModelSignature(
            inputs=tuple(_signature(arg, optional_allowed=True) for arg in session.get_inputs()),
            outputs=tuple(_signature(arg) for arg in session.get_outputs()),
            overridable=tuple(_signature(arg) for arg in session.get_overridable_initializers()),
        )

    def load(self, model_path: Path, config: ModelConfig, instance_index: int) -> OnnxRuntimeInstance:
        ort = _import_ort()
        plan = plan_providers(config)
        tensorrt_accelerator_options(config)  # a wrong accelerator parameter fails every load, TensorRT or not
        available = set(ort.get_available_providers())
        chosen: list[str] = []
        missing: list[str] = []
        for short in plan.requested:
            (chosen if PROVIDER_NAMES[short] in available else missing).append(short)
        fallback = None
        if missing:
            reason = (f"execution provider(s) {', '.join(missing)} requested by model {config.name} are not "
                      f"available in this onnxruntime build (available: {', '.join(sorted(available))})")
            if not plan.allow_fallback or not chosen:
                raise BackendUnavailable(reason + "; install a build with them (on a Jetson, NVIDIA's "
                                         "onnxruntime-gpu) or set parameter allow_provider_fallback to \"true\"")
            fallback = reason
            log.warning("%s; falling back to %s as the config allows", reason, ", ".join(chosen))
        options = _session_options(ort, config)
        options_by_provider = [provider_options(short, config, model_path) for short in chosen]
        session = _create_session(ort, model_path, options, [PROVIDER_NAMES[s] for s in chosen],
                                  options_by_provider)
        _refuse_non_tensors(session, config)
        shrink = config.parameters.get("memory.enable_memory_arena_shrinkage", "")
        info = InstanceInfo(device="cuda:0" if {"cuda", "tensorrt"} & set(chosen) else "cpu",
                            providers=tuple(session.get_providers()), fallback=fallback,
                            details={"onnxruntime": ort.__version__, "instance": instance_index,
                                     "graph_optimization_level": graph_optimization_level(config)})
        return OnnxRuntimeInstance(ort, session, info, shrink)

    def available_gpus(self) -> tuple[int, ...]:
        ort = _import_ort()
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return ()  # a CPU build: KIND_AUTO stays on the CPU instead of failing for a missing provider
        return cuda_device_ids()

    def runtime_info(self) -> dict[str, Any]:
        try:
            ort = _import_ort()
        except BackendUnavailable as e:
            return {"available": False, "reason": str(e)}
        return {"available": True, "version": ort.__version__, "providers": ort.get_available_providers()}


def cuda_device_ids(dev: Path = Path("/dev")) -> tuple[int, ...]:
    """GPU ids from the device nodes: /dev/nvidiaN on discrete GPUs and Thor, the nvgpu nodes (one GPU, id 0)
    on Jetson modules up to Orin. Reading nodes avoids initialising CUDA just to count devices."""
    discrete = sorted(int(p.name[6:]) for p in dev.glob("nvidia[0-9]*") if p.name[6:].isdigit())
    if discrete:
        return tuple(discrete)
    if (dev / "nvhost-gpu").exists() or (dev / "nvgpu" / "igpu0").exists():
        return (0,)
    return ()


def _signature(arg: Any, optional_allowed: bool = False) -> TensorSignature:
    # An optional(tensor(T)) input is a T tensor a request may leave out; other non-tensors are refused at load.
    element = _OPTIONAL_TENSOR.fullmatch(arg.type) if optional_allowed else None
    ort_type = element.group(1) if element else arg.type
    data_type = ORT_TO_TRITON.get(ort_type, f"{UNSUPPORTED}{arg.type})")
    dims: list[int] = []
    symbols: list[str | None] = []
    for dim in arg.shape:
        if isinstance(dim, int) and dim >= 0:
            dims.append(dim)
            symbols.append(None)
        else:
            dims.append(-1)
            symbols.append(dim if isinstance(dim, str) else None)
    return TensorSignature(arg.name, data_type, tuple(dims), tuple(symbols), optional=element is not None)


def _refuse_non_tensors(session: Any, config: ModelConfig) -> None:
    """Refuse a config naming an input or output that the model has as a sequence, map or optional (ZipMap's
    probabilities): with auto-complete off nothing compared them, and every run that touched it failed."""
    named = {spec.name for spec in (*config.input, *config.output)}
    for kind, args in (("input", session.get_inputs()), ("output", session.get_outputs())):
        for arg in args:
            served = arg.type.startswith("tensor(") or (kind == "input" and _OPTIONAL_TENSOR.fullmatch(arg.type))
            if arg.name in named and not served:
                raise ModelLoadError(f"model {config.name}: {not_a_tensor(kind, arg.name, arg.type)}")
    if config.max_batch_size > 0:
        for spec in config.input:
            if spec.optional:  # Triton's rule: a batch would mix requests that give the input with ones that do not
                raise ModelLoadError(f"model {config.name}: optional input {spec.name!r} is not supported for "
                                     "models that support batching (max_batch_size > 0); set max_batch_size 0")


def _session_options(ort: Any, config: ModelConfig) -> Any:
    params = config.parameters
    options = ort.SessionOptions()
    intra, inter = thread_count(params, "intra_op_thread_count"), thread_count(params, "inter_op_thread_count")
    options.intra_op_num_threads = 1 if intra is None else intra
    options.inter_op_num_threads = 1 if inter is None else inter
    options.enable_cpu_mem_arena = _flag(params, "enable_mem_arena", True)
    options.enable_mem_pattern = _flag(params, "enable_mem_pattern", True)
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, graph_optimization_level(config))
    options.log_severity_level = 3
    return options


# Triton's ONNX Runtime backend reads optimization { graph { level } } so: -1 basic, 1 extended, 2 none, else all.
_TRITON_GRAPH_LEVELS = {-1: "ORT_ENABLE_BASIC", 1: "ORT_ENABLE_EXTENDED", 2: "ORT_DISABLE_ALL"}
_GRAPH_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
                 "all": "ORT_ENABLE_ALL"}


def graph_optimization_level(config: ModelConfig) -> str:
    """The session's GraphOptimizationLevel name: edged's parameter graph_optimization_level where given, else
    Triton's ``optimization.graph.level``."""
    given = config.parameters.get("graph_optimization_level")
    if given is None:
        graph = config.optimization.get("graph")
        level = graph.get("level", 0) if isinstance(graph, dict) else 0
        return _TRITON_GRAPH_LEVELS.get(level, "ORT_ENABLE_ALL")
    if given.lower() not in _GRAPH_LEVELS:
        raise ModelLoadError(f"model {config.name}: parameter graph_optimization_level: expected one of "
                             f"{', '.join(_GRAPH_LEVELS)}, found {given.lower()!r}")
    return _GRAPH_LEVELS[given.lower()]


def provider_options(short: str, config: ModelConfig, model_path: Path) -> dict[str, str]:
    """The ORT provider options of one execution provider: edged's model parameters, and for TensorRT the
    parameters of Triton's ``tensorrt`` GPU execution accelerator, which take precedence."""
    params = config.parameters
    if short == "cuda":
        options = {"arena_extend_strategy": params.get("arena_extend_strategy", "kSameAsRequested")}
        if "gpu_mem_limit" in params:
            options["gpu_mem_limit"] = str(_int_param(params, "gpu_mem_limit", 0))
        return options
    if short == "tensorrt":
        cache = params.get("trt_engine_cache_path") or str(model_path.parent / "trt_cache")
        options = {"trt_engine_cache_enable": "True", "trt_engine_cache_path": cache}
        if params.get("precision_mode", "").upper() == "FP16":
            options["trt_fp16_enable"] = "True"
        accelerator = tensorrt_accelerator_options(config)
        fp32 = accelerator.pop("fp32", "")
        if fp32 or "trt_int8_enable" in accelerator or "trt_bf16_enable" in accelerator:
            options.pop("trt_fp16_enable", None)  # the accelerator's precision_mode decides
        return options | accelerator
    return {}


# Triton's ONNX Runtime backend: the tensorrt accelerator's precision_mode and max_workspace_size_bytes become
# these ORT options; its other keys are ORT's own option names. Options naming files are left to the model
# parameter trt_engine_cache_path, which edged keeps inside the model folder.
_PRECISIONS = {"FP32": "", "FP16": "trt_fp16_enable", "BF16": "trt_bf16_enable", "INT8": "trt_int8_enable"}
_TRT_PATH_OPTIONS = frozenset({"trt_engine_cache_path", "trt_timing_cache_path", "trt_extra_plugin_lib_paths",
                               "trt_ep_context_file_path", "int8_calibration_table_name"})
_TRT_OPTIONS = frozenset({
    "trt_max_partition_iterations", "trt_min_subgraph_size", "int8_use_native_calibration_table", "trt_dla_enable",
    "trt_dla_core", "trt_engine_cache_enable", "trt_engine_cache_prefix", "trt_dump_subgraphs",
    "trt_force_sequential_engine_build", "trt_context_memory_sharing_enable", "trt_layer_norm_fp32_fallback",
    "trt_timing_cache_enable", "trt_force_timing_cache", "trt_detailed_build_log", "trt_build_heuristics_enable",
    "trt_sparsity_enable", "trt_builder_optimization_level", "trt_auxiliary_streams", "trt_tactic_sources",
    "trt_profile_min_shapes", "trt_profile_max_shapes", "trt_profile_opt_shapes", "trt_cuda_graph_enable",
    "trt_dump_ep_context_model", "trt_ep_context_embed_mode"})


def tensorrt_accelerator_options(config: ModelConfig) -> dict[str, str]:
    """ORT TensorRT options from the parameters of the config's ``tensorrt`` GPU execution accelerator, checked as
    Triton checks them (an unknown key or a bad precision fails the load)."""
    accelerators = config.optimization.get("execution_accelerators", {})
    accelerators = accelerators if isinstance(accelerators, dict) else {}
    for field, kind, known in (("gpu_execution_accelerator", "GPU", ("tensorrt", "cuda")),
                               ("cpu_execution_accelerator", "CPU", ("openvino",))):
        for accelerator in accelerators.get(field, []):
            name = accelerator.get("name", "") if isinstance(accelerator, dict) else ""
            if name not in known:  # a misspelt name ran without the accelerator, with no word
                raise ModelLoadError(f"unknown {kind} execution accelerator {name!r} in model {config.name} (Triton "
                                     f"knows {', '.join(known)})")
    found = accelerators.get("gpu_execution_accelerator", [])
    options: dict[str, str] = {}
    for accelerator in found:
        if not isinstance(accelerator, dict) or accelerator.get("name") != "tensorrt":
            continue
        for key, value in dict(accelerator.get("parameters", {})).items():
            where = f"model {config.name}: the tensorrt execution accelerator's parameter"
            if key == "precision_mode":
                if value not in _PRECISIONS:
                    raise ModelLoadError(f"{where} precision_mode {value!r} is not one of {', '.join(_PRECISIONS)}")
                options[_PRECISIONS[value] or "fp32"] = "True"
            elif key == "max_workspace_size_bytes":
                if not (isinstance(value, str) and value.isascii() and value.isdigit()):
                    raise ModelLoadError(f"{where} max_workspace_size_bytes {value!r} is not a number of bytes")
                options["trt_max_workspace_size"] = value
            elif key in _TRT_PATH_OPTIONS:
                raise ModelLoadError(f"{where} {key} names a file edged does not confine to the model folder; set "
                                     "the model parameter trt_engine_cache_path (a folder inside the model folder) "
                                     "for the engine cache, or leave it out")
            elif key == "trt_engine_cache_prefix" and not _is_file_prefix(str(value)):
                raise ModelLoadError(f"{where} trt_engine_cache_prefix {value!r} is not one file name prefix: ORT "
                                     "joins it to the engine cache folder, so '/', '\\' and NUL would place the "
                                     "engines outside it; use letters, digits, '_', '-' and '.' (e.g. 'cam0_')")
            elif key in _TRT_OPTIONS:
                options[key] = str(value)
            else:
                raise ModelLoadError(f"unknown parameter {key!r} of the tensorrt execution accelerator in model "
                                     f"{config.name} (Triton refuses it too)")
    return options


def _is_file_prefix(value: str) -> bool:
    """Whether a value can only name files inside the folder it is joined to (no separator, no NUL)."""
    return not any(c in value for c in "/\\\0")


def _create_session(ort: Any, model_path: Path, options: Any, providers: list[str],
                    provider_options: list[dict[str, str]]) -> Any:
    try:
        return ort.InferenceSession(str(model_path), sess_options=options, providers=providers,
                                    provider_options=provider_options)
    except Exception as e:  # onnxruntime raises its own exception types for every load failure
        raise ModelLoadError(f"onnxruntime could not load {model_path}: {e}") from e


def _as_str_tensors(inputs: Mapping[str, Array], names: frozenset[str]) -> dict[str, Array]:
    converted = dict(inputs)
    for name in names & converted.keys():
        array = converted[name]
        flat = array.ravel()
        try:
            texts = [item.decode("utf-8") if isinstance(item, bytes) else str(item) for item in flat]
        except UnicodeDecodeError:
            raise InvalidInput(f"input {name!r}: a BYTES element is not UTF-8 text, which ONNX string tensors "
                               "need") from None
        result = np.empty(flat.shape, dtype=object)
        result[:] = texts
        converted[name] = result.reshape(array.shape)
    return converted


class _NeverRaised(Exception):
    """Stands for ORT's EPFail where the installed ORT does not define it."""


class OnnxRuntimeInstance:
    """One ONNX Runtime session; ``run`` is thread-safe as ORT sessions are."""

    def __init__(self, ort: Any, session: Any, info: InstanceInfo, shrinkage: str) -> None:
        self._session: Any = session
        self.info = info
        # As in Triton's ONNX Runtime backend, shrinkage applies to every run when the config asks for it:
        # the CPU arena never shrinks by itself after a large batch (docs/field-notes.md).
        # One RunOptions for every run, even without settings: given None, ORT builds a default one per run, which
        # cost a small model's run 20-60 % more (docs/benchmarks.md). Runs only read it, so threads share it.
        self._run_options: Any = ort.RunOptions()
        if shrinkage:
            self._run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", shrinkage)
        # BYTES tensors arrive as bytes objects; ORT would store their repr ("b'..'"), so they become str.
        self._string_inputs = frozenset(arg.name for arg in session.get_inputs() if arg.type == "tensor(string)")
        # The compiled session under ORT's Python wrapper: the wrapper's own checks (WebGPU graph capture,
        # OrtValue ownership, input names, which the C++ session checks again) cost a quarter of a small model's
        # run (docs/benchmarks.md). What they guard is kept: a feed that lacks a required input, and a run that
        # fails with EPFail (the wrapper then falls back to other providers), go through the wrapper.
        self._direct: Any = getattr(session, "_sess", None)
        self._required = frozenset(arg.name for arg in session.get_inputs() if not arg.type.startswith("optional"))
        state = getattr(getattr(ort, "capi", None), "_pybind_state", None)
        self._ep_fail: type[BaseException] = getattr(state, "EPFail", _NeverRaised)
        # Small runs of a CPU session go through an IOBinding bound once per input layout (_ort_binding); string
        # inputs are converted per run, and other providers keep ORT's own placement of inputs and outputs.
        self._bindings: Bindings | None = None
        if (self._direct is not None and state is not None and not self._string_inputs
                and list(session.get_providers()) == ["CPUExecutionProvider"]):
            try:
                self._bindings = Bindings(state, self._direct)
            except Exception:  # an ORT build without this binding API: plain runs
                log.debug("onnxruntime %s: no IOBinding, every run goes through run()", ort.__version__)

    def run(self, inputs: Mapping[str, Array], output_names: Sequence[str]) -> dict[str, Array]:
        session = self._session
        if session is None:
            raise InferenceFailed("the ONNX Runtime session was closed")
        if self._string_inputs:
            inputs = _as_str_tensors(inputs, self._string_inputs)
        bindings = self._bindings
        if bindings is not None:
            bound = bindings.run(inputs, output_names, self._run_options)
            if bound is not None:
                return bound
        try:
            direct = self._direct
            if direct is None or not output_names or not inputs.keys() >= self._required:
                results = session.run(output_names, inputs, self._run_options)
            else:
                try:
                    results = direct.run(output_names, inputs, self._run_options)
                except self._ep_fail:
                    results = session.run(output_names, inputs, self._run_options)  # its provider fallback
                    self._direct = getattr(session, "_sess", None)  # the fallback built a new compiled session
        except Exception as e:  # translate ORT's errors at the boundary
            message = str(e)
            if "INVALID_ARGUMENT" in message or "Got invalid dimensions" in message:
                raise InvalidInput(f"onnxruntime rejected the input: {message}") from e
            raise InferenceFailed(f"onnxruntime failed: {message}") from e
        outputs = dict(zip(output_names, results, strict=True))
        if bindings is not None and bindings.enabled:
            bindings.learn(inputs, output_names, outputs)
        return outputs

    def release_memory(self) -> None:
        # Nothing to do between runs: arena shrinkage rides on the run options, and the session's memory
        # goes back when close() drops it.
        return

    def close(self) -> None:
        self._session = self._direct = self._bindings = None

"""PyTorch backend: TorchScript (``model.pt``) and torch.export programs (``model.pt2``).

As in Triton's PyTorch backend, a model needs an explicit config: inputs are passed positionally in config
order (or by the index in a ``NAME__<i>`` name), outputs are taken from the returned tensor, tuple or dict in
config order (or by ``__<i>`` index, or by key), and must be tensors of the config's data_type. Runs under
``torch.inference_mode`` on CUDA when the config asks for a GPU instance and CUDA is available, else on the CPU;
a GPU request without CUDA fails the load unless ``allow_provider_fallback`` is "true".

Failures keep their family: an input the module cannot take (a missing input, torch's argument check, an
operator's shape or dtype check, a torch.export program's guard on its dynamic shapes) is InvalidInput (HTTP
400); running out of memory is OutOfMemory (503); an exception the model raises itself (``raise`` in TorchScript
surfaces as ``torch.jit.Error``) or any other runtime failure, CUDA errors included, is InferenceFailed (500).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends._threads import thread_count
from edged.backends.base import Array, InstanceInfo
from edged.errors import BackendUnavailable, EdgedError, InferenceFailed, InvalidInput, ModelLoadError, OutOfMemory
from edged.repository.datatypes import NUMPY_TO_TRITON, TRITON_TO_NUMPY
from edged.repository.model_config import ModelConfig, ModelSignature

log = logging.getLogger(__name__)

_INDEXED_NAME = re.compile(r"__(\d+)$")
# torch raises RuntimeError for nearly everything; these words in its last line tell the causes apart.
_OUT_OF_MEMORY = re.compile(r"out of memory|can't allocate memory|not enough memory", re.IGNORECASE)
_DEVICE_FAILURE = re.compile(r"CUDA error|cuDNN|CUBLAS|cuFFT|NCCL|device-side assert", re.IGNORECASE)
_INPUT_MISMATCH = re.compile(r"shape|size of tensor|dimension|dtype|scalar type|channels|^forward\(\)",
                             re.IGNORECASE)


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise BackendUnavailable(
            "torch is not installed: install edged with the 'torch' extra; on a Jetson use NVIDIA's torch "
            "build for your JetPack") from e
    return torch


def positional_order(names: Sequence[str]) -> list[int]:
    """Position of each config tensor: its ``__<i>`` index when every name has one, else config order."""
    indices = [_INDEXED_NAME.search(name) for name in names]
    if names and all(indices):
        return [int(m.group(1)) for m in indices if m is not None]
    return list(range(len(names)))


class PyTorchBackend:
    name = "pytorch"

    def describe(self, model_path: Path) -> ModelSignature:
        raise ModelLoadError(
            f"{model_path}: PyTorch models carry no input/output description edged can trust; write a "
            "config.pbtxt listing every input and output (name, data_type, dims)")

    def load(self, model_path: Path, config: ModelConfig, instance_index: int) -> PyTorchInstance:
        torch = _import_torch()
        if not config.input or not config.output:
            self.describe(model_path)
        _refuse_strings(config)
        device, fallback = _choose_device(torch, config)
        _apply_threads(torch, config)
        allocator = apply_cuda_allocator_settings(torch, config, device)
        try:
            if model_path.suffix == ".pt2":
                module = torch.export.load(str(model_path)).module()
                module.to(device)
            else:
                module = torch.jit.load(str(model_path), map_location=device)
                module.eval()
        except Exception as e:  # torch raises many types for a bad file
            raise ModelLoadError(f"torch could not load {model_path}: {e}") from e
        info = InstanceInfo(device=str(device), fallback=fallback,
                            details={"torch": torch.__version__, "format": model_path.suffix.lstrip("."),
                                     "instance": instance_index, **allocator})
        return PyTorchInstance(torch, module, device, config, info)

    def available_gpus(self) -> tuple[int, ...]:
        torch = _import_torch()
        return tuple(range(torch.cuda.device_count())) if torch.cuda.is_available() else ()

    def runtime_info(self) -> dict[str, Any]:
        try:
            torch = _import_torch()
        except BackendUnavailable as e:
            return {"available": False, "reason": str(e)}
        return {"available": True, "version": torch.__version__, "cuda": bool(torch.cuda.is_available())}


def _apply_threads(torch: Any, config: ModelConfig) -> None:
    """torch's thread pools are process-wide: the intra-op count of the model loaded last applies; the inter-op
    count can be set once per process only, before parallel work starts (as in Triton, the first one wins).
    Triton's PyTorch backend names them INTRA_OP_THREAD_COUNT and INTER_OP_THREAD_COUNT (NUM_THREADS and
    NUM_INTEROP_THREADS for torch.export programs); edged also reads the onnxruntime backend's names."""
    intra = thread_count(config.parameters, "INTRA_OP_THREAD_COUNT", "NUM_THREADS", "intra_op_thread_count")
    inter = thread_count(config.parameters, "INTER_OP_THREAD_COUNT", "NUM_INTEROP_THREADS", "inter_op_thread_count")
    if intra:
        torch.set_num_threads(intra)
    if inter and inter != torch.get_num_interop_threads():
        try:
            torch.set_num_interop_threads(inter)
        except RuntimeError:
            log.warning("model %s: its inter-op thread count %d is not applied: torch's inter-op pool is "
                        "process-wide and already runs %d threads", config.name, inter,
                        torch.get_num_interop_threads())


def _refuse_strings(config: ModelConfig) -> None:
    """Torch tensors hold numbers and booleans only; Triton's List[str] arguments are not offered, so a BYTES
    input failed every request with a 500 (numpy's object arrays do not convert)."""
    for kind, specs in (("input", config.input), ("output", config.output)):
        for spec in specs:
            if spec.data_type == "TYPE_STRING":
                raise ModelLoadError(f"model {config.name}: {kind} {spec.name!r} is TYPE_STRING, which the pytorch "
                                     "backend does not serve (torch tensors hold numbers and booleans); pass text "
                                     "as UINT8 bytes or INT64 token ids")


def cuda_allocator_plan(config: ModelConfig) -> tuple[float | None, str]:
    """(per-process memory fraction, caching-allocator settings) from the model's parameters (pure)."""
    raw = config.parameters.get("cuda_memory_fraction", "")
    fraction = None
    if raw:
        try:
            fraction = float(raw)
        except ValueError:
            fraction = -1.0
        if not 0.0 < fraction <= 1.0:
            raise ModelLoadError(f"model {config.name}: parameter cuda_memory_fraction: expected a number in (0, 1], "
                                 f"found {raw!r}")
    settings = config.parameters.get("cuda_allocator_settings", "")
    for item in filter(None, (part.strip() for part in settings.split(","))):
        if ":" not in item:
            raise ModelLoadError(f"model {config.name}: parameter cuda_allocator_settings: expected key:value "
                                 "pairs such as \"expandable_segments:True,garbage_collection_threshold:0.6\", "
                                 f"found {item!r}")
    return fraction, settings


def apply_cuda_allocator_settings(torch: Any, config: ModelConfig, device: Any) -> dict[str, Any]:
    """Apply the caching-allocator settings on a CUDA device: they shape how much of a Jetson's shared memory
    torch keeps cached. They are process-wide in torch, so the last model loaded wins; reported per instance."""
    fraction, settings = cuda_allocator_plan(config)
    if device.type != "cuda":
        return {}
    applied: dict[str, Any] = {}
    if settings:
        setter = getattr(torch.cuda.memory, "_set_allocator_settings", None)
        if setter is None:
            raise BackendUnavailable(f"model {config.name}: this torch ({torch.__version__}) cannot change "
                                     "allocator settings at run time; set PYTORCH_CUDA_ALLOC_CONF in the unit")
        setter(settings)
        applied["cuda_allocator_settings"] = settings
    if fraction is not None:
        torch.cuda.set_per_process_memory_fraction(fraction, device)
        applied["cuda_memory_fraction"] = fraction
    return applied


def _choose_device(torch: Any, config: ModelConfig) -> tuple[Any, str | None]:
    wants_gpu = any(group.kind == "KIND_GPU" for group in config.instance_group)
    if not wants_gpu:
        return torch.device("cpu"), None
    if torch.cuda.is_available():
        gpus = [gpu for group in config.instance_group for gpu in group.gpus]
        return torch.device(f"cuda:{gpus[0] if gpus else 0}"), None
    reason = f"model {config.name} asks for a GPU instance but torch has no CUDA device"
    if config.parameters.get("allow_provider_fallback", "").lower() != "true":
        raise BackendUnavailable(reason + "; set parameter allow_provider_fallback to \"true\" to run on the "
                                 "CPU")
    log.warning("%s; running on the CPU as the config allows", reason)
    return torch.device("cpu"), reason


def translate_failure(torch: Any, error: Exception) -> EdgedError:
    """The edged family of an exception raised by a module call (see the module docstring)."""
    lines = str(error).strip().splitlines() or [type(error).__name__]
    # A failure of the call itself (torch's argument check) says so on its first line; an operator's failure
    # inside TorchScript comes after the script's traceback, on the last.
    cause = lines[0] if lines[0].startswith("forward()") else lines[-1]
    # torch.OutOfMemoryError exists only in recent torch; older JetPack builds have torch.cuda.OutOfMemoryError
    oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                  getattr(torch.cuda, "OutOfMemoryError", None)) if isinstance(t, type))
    if isinstance(error, oom_types) or _OUT_OF_MEMORY.search(cause):
        return OutOfMemory(f"torch ran out of memory: {cause}")
    if isinstance(error, torch.jit.Error):
        return InferenceFailed(f"the model raised: {cause}")
    if (isinstance(error, RuntimeError | TypeError | ValueError) and not _DEVICE_FAILURE.search(cause)
            and _INPUT_MISMATCH.search(cause)):
        return InvalidInput(f"torch rejected the input: {cause}")
    if isinstance(error, AssertionError) and cause.startswith("Guard failed"):
        # a torch.export program checks its inputs against the shapes it was exported for (its Dim ranges)
        return InvalidInput(f"torch rejected the input: {cause} (the range the program was exported for)")
    return InferenceFailed(f"torch failed: {cause}")


class PyTorchInstance:
    def __init__(self, torch: Any, module: Any, device: Any, config: ModelConfig, info: InstanceInfo) -> None:
        self._torch = torch
        self._module: Any = module
        self._device = device
        self.info = info
        self._input_names = [t.name for t in config.input]
        self._input_positions = positional_order(self._input_names)
        self._output_names = [t.name for t in config.output]
        self._output_positions = dict(zip(self._output_names, positional_order(self._output_names),
                                          strict=True))
        self._output_types = {t.name: t.data_type for t in config.output}
        # TorchScript modules are not documented as safe for concurrent calls; instances > 1 give parallelism.
        self._lock = threading.Lock()

    def run(self, inputs: Mapping[str, Array], output_names: Sequence[str]) -> dict[str, Array]:
        torch = self._torch
        module = self._module
        if module is None:
            raise InferenceFailed("the PyTorch module was closed")
        args: list[Any] = [None] * len(self._input_names)
        for name, position in zip(self._input_names, self._input_positions, strict=True):
            if name in inputs:
                args[position] = torch.from_numpy(self._own(inputs[name])).to(self._device)
        try:
            with self._lock, torch.inference_mode():
                result = module(*args)
        except Exception as e:  # a model may raise anything from its forward()
            raise translate_failure(torch, e) from e
        return {name: self._pick(result, name) for name in output_names}

    def _own(self, array: Array) -> Array:
        """An array torch may write into. A read-only one is a view of a client's shared-memory region or of a
        request's body: torch ignores the flag, so a model writing into its input (x /= 255 in traced
        preprocessing) changed the client's frame. On a GPU the move to the device copies it anyway."""
        if array.flags.writeable or self._device.type != "cpu":
            return np.ascontiguousarray(array)
        return np.array(array, order="C")

    def _pick(self, result: Any, name: str) -> Array:
        if isinstance(result, dict):
            tensor = result.get(name)
        elif isinstance(result, list | tuple):
            position = self._output_positions[name]
            tensor = result[position] if position < len(result) else None
        else:
            tensor = result if self._output_positions[name] == 0 else None
        if tensor is None:
            raise InferenceFailed(f"the PyTorch model returned no value for output {name}")
        # What the config declares is what metadata advertises and clients decode: anything else fails the run
        # (and so the load, at warm-up), as in Triton's PyTorch backend, instead of answering another datatype.
        if not isinstance(tensor, self._torch.Tensor):
            raise InferenceFailed(f"the PyTorch model returned a {type(tensor).__name__} for output {name!r}, not a "
                                  "tensor; return a tensor per output (a tuple, list or dict of tensors)")
        if tensor.dtype == self._torch.bfloat16:
            raise InferenceFailed(f"the PyTorch model returned output {name!r} as bfloat16, which edged cannot serve "
                                  "(numpy has no bfloat16); convert it in the model (.half() or .float())")
        array: Array = tensor.detach().cpu().numpy()
        declared = self._output_types[name]
        if TRITON_TO_NUMPY.get(declared) != array.dtype:
            found = NUMPY_TO_TRITON.get(array.dtype, str(array.dtype))
            raise InferenceFailed(f"the PyTorch model returned output {name!r} as {array.dtype} ({found}), but the "
                                  f"config declares {declared}; correct data_type in config.pbtxt or convert it in "
                                  "the model")
        return array

    def release_memory(self) -> None:
        if self._device.type == "cuda":
            self._torch.cuda.empty_cache()

    def close(self) -> None:
        device = self._device
        self._module = None
        if device.type == "cuda":
            self._torch.cuda.empty_cache()

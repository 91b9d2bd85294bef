"""TensorRT backend: serialised engines (``model.plan``) on NVIDIA GPUs, Jetson first.

Config parameters (Triton's, plus one value): ``execution_context_allocation_strategy`` = STATIC (default:
the context holds the largest activation memory of all profiles), ON_PROFILE_CHANGE (reallocated when a
profile is selected) or USER_MANAGED (edged's addition: the context borrows the backend's `ScratchArena`,
one block shared by every USER_MANAGED engine, which then run one at a time). Strategies need TensorRT 10.

Loading checks the engine's sidecar (``model.plan.json``) against this TensorRT and GPU, refuses I/O that is
not LINEAR, and checks config.pbtxt against the engine's bindings. On integrated GPUs the I/O buffers are
mapped host memory (zero-copy). TensorRT and CUDA bindings are imported only when a model is described or
loaded; without them the backend raises BackendUnavailable that says how to install them.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from edged.backends._trt_cuda import CudaApi, CudaError, DeviceProps, load_cuda_api
from edged.backends._trt_instance import InstanceSetup, TensorRTInstance, TrtHandles
from edged.backends._trt_meta import (
    EngineMeta,
    RuntimeIdentity,
    TrtCapabilities,
    check_compatible,
    describe_meta,
    read_l4t_release,
    read_sidecar,
)
from edged.backends._trt_plan import (
    check_config,
    check_servable,
    discover_bindings,
    signature,
)
from edged.backends._trt_runtime import (
    TrtEngineView,
    create_context,
    deserialize,
    import_tensorrt,
    make_logger,
    parse_allocation_strategy,
    tensorrt_version,
)
from edged.backends._trt_scratch import ScratchArena, scratch_bytes
from edged.backends.base import InstanceInfo
from edged.errors import BackendUnavailable, ModelLoadError
from edged.repository.model_config import ModelConfig, ModelSignature

log = logging.getLogger(__name__)
MIN_TENSORRT = (8, 5)


class TensorRTBackend:
    name = "tensorrt"

    def __init__(self, arena: ScratchArena | None = None) -> None:
        self.arena = arena if arena is not None else ScratchArena()
        self._cuda: CudaApi | None = None
        self._lock = threading.Lock()

    def _tensorrt(self) -> tuple[Any, TrtCapabilities]:
        trt = import_tensorrt()
        caps = TrtCapabilities.from_version(str(trt.__version__))
        if (caps.major, caps.minor) < MIN_TENSORRT:
            raise BackendUnavailable(f"TensorRT {caps.version} is too old: edged needs TensorRT >= 8.5 "
                                     f"(JetPack >= 5.1) for the name-based I/O API")
        return trt, caps

    def _runtime(self) -> tuple[Any, TrtCapabilities, CudaApi]:
        trt, caps = self._tensorrt()
        with self._lock:
            if self._cuda is None:
                self._cuda = load_cuda_api()
            return trt, caps, self._cuda

    def _engine(self, trt: Any, caps: TrtCapabilities, path: Path) -> tuple[TrtHandles, TrtEngineView]:
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ModelLoadError(f"TensorRT engine {path}: cannot be read ({e})") from e
        logger = make_logger(trt)
        runtime = trt.Runtime(logger)
        engine = deserialize(trt, runtime, logger, data, str(path))
        return TrtHandles(runtime=runtime, engine=engine, context=None, logger=logger), \
            TrtEngineView(trt, engine, caps)

    def describe(self, model_path: Path) -> ModelSignature:
        trt, caps = self._tensorrt()
        handles, view = self._engine(trt, caps, model_path)
        try:
            return signature(discover_bindings(view))
        finally:
            handles.engine = None
            handles.runtime = None

    def load(self, model_path: Path, config: ModelConfig, instance_index: int) -> TensorRTInstance:
        trt, caps, cuda = self._runtime()
        strategy = parse_allocation_strategy(config.parameters, caps)
        props = _device(cuda)
        here = RuntimeIdentity(caps.version, props.name, props.compute_capability, read_l4t_release())
        meta = read_sidecar(model_path)
        for warning in check_compatible(model_path, meta, here):
            log.warning("%s", warning, extra={"model": config.name})
        handles, view = self._engine(trt, caps, model_path)
        bindings = discover_bindings(view)
        check_servable(config.name, bindings)
        if config.input or config.output:
            check_config(config, bindings)
        name = f"{config.name}/{model_path.parent.name}#{instance_index}"
        zero_copy = props.integrated and props.can_map_host_memory and cuda.supports_mapped_host
        need = scratch_bytes(view.device_memory_size(),
                             [view.profile_device_memory_size(p) for p in range(view.num_profiles())]) \
            if strategy == "USER_MANAGED" else 0
        setup = InstanceSetup(name, bindings, caps, strategy, zero_copy, need)
        try:
            handles.context = create_context(trt, handles.engine, strategy, caps)
            if need:
                self.arena.register(name, need, cuda)
            info = _info(setup, props, cuda, meta, self.arena)
            return TensorRTInstance(setup, handles, cuda, self.arena if need else None, info)
        except CudaError as e:
            self.arena.unregister(name)
            raise ModelLoadError(f"model {config.name!r}: CUDA failed while loading {model_path}: {e}") from e

    def available_gpus(self) -> tuple[int, ...]:
        # TensorRT engines run on the GPU only; edged uses device 0 (instance_group gpus are not honoured yet).
        return (0,)

    def runtime_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"tensorrt": tensorrt_version() or "not installed"}
        try:
            with self._lock:
                if self._cuda is None:
                    self._cuda = load_cuda_api()
                cuda = self._cuda
            info["cuda"] = {"provider": cuda.provider, **cuda.device_properties(0).as_dict()}
        except (BackendUnavailable, CudaError) as e:
            info["cuda"] = {"available": False, "reason": str(e)}
        info["scratch_arena"] = self.arena.stats()
        return info

    def close(self) -> None:
        """Free the scratch arena (after every instance is closed)."""
        self.arena.close()


def _device(cuda: CudaApi) -> DeviceProps:
    try:
        return cuda.device_properties(0)
    except CudaError as e:
        raise BackendUnavailable(f"no usable CUDA device for TensorRT: {e}") from e


def _info(setup: InstanceSetup, props: DeviceProps, cuda: CudaApi, meta: EngineMeta | None,
          arena: ScratchArena) -> InstanceInfo:
    bindings = setup.bindings
    details: dict[str, Any] = {
        "tensorrt": setup.caps.version, "allocation_strategy": setup.strategy,
        "integrated_gpu": props.integrated, "zero_copy_io": setup.zero_copy, "cuda_provider": cuda.provider,
        "device_name": props.name, "compute_capability": props.compute_capability,
        "optimization_profiles": len(next((b.profiles for b in bindings if b.is_input), ())),
        **describe_meta(meta),
    }
    if setup.strategy == "USER_MANAGED":
        details["scratch_bytes_needed"] = setup.scratch_need
        details["scratch_arena_bytes"] = arena.size
    if props.integrated and not setup.zero_copy:
        details["zero_copy_unavailable"] = f"{cuda.provider} cannot map host memory" \
            if not cuda.supports_mapped_host else "the device cannot map host memory"
    return InstanceInfo(device=f"cuda:{props.index}", details=details)

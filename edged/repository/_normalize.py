"""Triton's normalization of a model config: the defaults the server fills in before it serves a model.

Follows NormalizeModelConfig and NormalizeInstanceGroup in triton-inference-server/core
(src/model_config_utils.cc): dynamic batching's preferred_batch_size defaults to [max_batch_size]; with no
instance_group, one group named after the model; each unnamed group is named ``<model>_<index>``; KIND_AUTO
becomes KIND_GPU when every listed GPU exists (and there is one), else KIND_CPU; a count of 0 becomes 1, or 2
for KIND_CPU with the onnxruntime or tensorflow backend (SetDefaultInstanceCount); KIND_GPU with no gpus gets
every GPU. The backend is filled from the platform and default_model_filename from the backend (model.onnx,
model.plan, model.pt), as real servers report them. Normalizing twice changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from edged.repository.model_config import BACKEND_DEFAULT_FILENAME, InstanceGroup, ModelConfig

# Backends whose CPU instances Triton doubles by default (SetDefaultInstanceCount).
_TWO_CPU_INSTANCES = frozenset({"onnxruntime", "tensorflow"})
# Triton's platform → backend table (AutoCompleteBackendFields), for the platforms edged knows.
PLATFORM_BACKENDS: dict[str, str] = {
    "onnxruntime_onnx": "onnxruntime",
    "tensorrt_plan": "tensorrt",
    "pytorch_libtorch": "pytorch",
    "torch_export": "pytorch",
    "tensorflow_graphdef": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
}
BACKEND_PLATFORMS: dict[str, str] = {
    "onnxruntime": "onnxruntime_onnx",
    "tensorrt": "tensorrt_plan",
    "pytorch": "pytorch_libtorch",
}


def normalize(config: ModelConfig, gpus: Sequence[int] = ()) -> ModelConfig:
    """Apply Triton's server-side defaults; ``gpus`` are the GPU ids present (none on a CPU-only host)."""
    batching = config.dynamic_batching
    if batching is not None and not batching.preferred_batch_size and config.max_batch_size > 0:
        batching = replace(batching, preferred_batch_size=(config.max_batch_size,))
    backend = config.backend or PLATFORM_BACKENDS.get(config.platform, "")
    groups = config.instance_group
    if "ensemble_scheduling" not in config.extra:
        if not groups:
            groups = (InstanceGroup(name=config.name, count=0),)
        groups = tuple(_group(group, index, config.name, backend, tuple(gpus))
                       for index, group in enumerate(groups))
    filename = config.default_model_filename
    if not filename and config.platform == "torch_export":
        filename = "model.pt2"
    elif not filename:
        filename = BACKEND_DEFAULT_FILENAME.get(backend, "")
    return replace(config, dynamic_batching=batching, instance_group=groups, backend=backend,
                   default_model_filename=filename)


def _group(group: InstanceGroup, index: int, model: str, backend: str,
           gpus: tuple[int, ...]) -> InstanceGroup:
    name = group.name or f"{model}_{index}"
    kind = group.kind
    if kind == "KIND_AUTO":
        usable = bool(gpus) and all(gpu in gpus for gpu in group.gpus)
        kind = "KIND_GPU" if usable else "KIND_CPU"
    count = group.count
    if count < 1:
        count = 2 if kind == "KIND_CPU" and backend in _TWO_CPU_INSTANCES else 1
    group_gpus = group.gpus
    if kind == "KIND_GPU" and not group_gpus:
        group_gpus = gpus
    return InstanceGroup(name=name, kind=kind, count=count, gpus=group_gpus)

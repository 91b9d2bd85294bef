"""Triton's ModelConfig as typed, frozen values.

This is the contract between the repository (which parses ``config.pbtxt`` and auto-completes it), the
backends and the engine. Field names follow Triton's protobuf (model_config.proto) so that the JSON form the
API reports is Triton's. Fields of that schema edged does not model are kept in ``extra`` (as JSON-ready values of
their schema types) and reported by name; the schedulers edged does not implement (``sequence_batching``,
``ensemble_scheduling``) are refused by the builder at their line, and a field the schema does not have too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# Triton's DataType enum names, and the KServe v2 datatype each one maps to.
TRITON_TO_KSERVE: dict[str, str] = {
    "TYPE_BOOL": "BOOL", "TYPE_UINT8": "UINT8", "TYPE_UINT16": "UINT16", "TYPE_UINT32": "UINT32",
    "TYPE_UINT64": "UINT64", "TYPE_INT8": "INT8", "TYPE_INT16": "INT16", "TYPE_INT32": "INT32",
    "TYPE_INT64": "INT64", "TYPE_FP16": "FP16", "TYPE_FP32": "FP32", "TYPE_FP64": "FP64",
    "TYPE_STRING": "BYTES", "TYPE_BF16": "BF16",
}
KSERVE_TO_TRITON: dict[str, str] = {v: k for k, v in TRITON_TO_KSERVE.items()}
# A backend's signature gives a tensor it cannot type this way, the file's own type inside: "UNSUPPORTED(seq(...))".
UNSUPPORTED = "UNSUPPORTED("

Platform = Literal["onnxruntime_onnx", "tensorrt_plan", "pytorch_libtorch", "torch_export", ""]
# Triton platform names and backend names that mean the same runtime; the backend name wins in edged.
PLATFORM_TO_BACKEND: dict[str, str] = {
    "onnxruntime_onnx": "onnxruntime",
    "tensorrt_plan": "tensorrt",
    "pytorch_libtorch": "pytorch",
    "torch_export": "pytorch",
}
BACKEND_DEFAULT_FILENAME: dict[str, str] = {
    "onnxruntime": "model.onnx",
    "tensorrt": "model.plan",
    "pytorch": "model.pt",
    # a generative model is its version folder; this file names the folder as ORT GenAI's entry point
    "onnxruntime_genai": "genai_config.json",
}


@dataclass(frozen=True)
class Reshape:
    shape: tuple[int, ...] = ()


@dataclass(frozen=True)
class TensorConfig:
    """One ``input`` or ``output`` entry. ``dims`` exclude the batch dimension when max_batch_size > 0."""

    name: str
    data_type: str = "TYPE_INVALID"  # a Triton DataType name such as TYPE_FP32
    dims: tuple[int, ...] = ()
    reshape: Reshape | None = None
    format: str = "FORMAT_NONE"
    optional: bool = False
    is_shape_tensor: bool = False
    allow_ragged_batch: bool = False
    label_filename: str = ""

    @property
    def datatype(self) -> str:
        """The KServe v2 datatype name (FP32, BYTES, ...)."""
        return TRITON_TO_KSERVE.get(self.data_type, self.data_type)


@dataclass(frozen=True)
class QueuePolicy:
    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0  # 0: unbounded in Triton; edged applies its own safe bound


@dataclass(frozen=True)
class DynamicBatching:
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_microseconds: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy = QueuePolicy()
    priority_queue_policy: dict[int, QueuePolicy] = field(default_factory=dict)


@dataclass(frozen=True)
class InstanceGroup:
    name: str = ""
    kind: Literal["KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL"] = "KIND_AUTO"
    count: int = 1
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class VersionPolicy:
    """Exactly one of Triton's three policies: latest N (the default, N=1), all, or specific versions."""

    kind: Literal["latest", "all", "specific"] = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()


@dataclass(frozen=True)
class WarmupInput:
    data_type: str
    dims: tuple[int, ...]
    source: Literal["zero_data", "random_data", "input_data_file"] = "zero_data"
    input_data_file: str = ""


@dataclass(frozen=True)
class ModelWarmup:
    """One ``model_warmup`` sample. As in Triton, batch_size 0 (protobuf's unset) skips the sample, and count 0 runs
    it once; both are reported as given."""

    name: str
    batch_size: int = 0
    inputs: dict[str, WarmupInput] = field(default_factory=dict)
    count: int = 0


@dataclass(frozen=True)
class ModelConfig:
    name: str
    platform: str = ""
    backend: str = ""
    max_batch_size: int = 0
    input: tuple[TensorConfig, ...] = ()
    output: tuple[TensorConfig, ...] = ()
    version_policy: VersionPolicy = VersionPolicy()
    instance_group: tuple[InstanceGroup, ...] = ()
    dynamic_batching: DynamicBatching | None = None
    parameters: dict[str, str] = field(default_factory=dict)
    model_warmup: tuple[ModelWarmup, ...] = ()
    default_model_filename: str = ""
    optimization: dict[str, Any] = field(default_factory=dict)  # kept as parsed; reported back
    extra: dict[str, Any] = field(default_factory=dict)  # fields edged does not model, kept as parsed

    @property
    def runtime(self) -> str:
        """The backend name edged uses (onnxruntime, tensorrt, pytorch), from backend or platform."""
        if self.backend:
            return self.backend
        return PLATFORM_TO_BACKEND.get(self.platform, self.platform)

    @property
    def model_filename(self) -> str:
        if self.default_model_filename:
            return self.default_model_filename
        if self.platform == "torch_export":
            return "model.pt2"
        return BACKEND_DEFAULT_FILENAME.get(self.runtime, "model")

    @property
    def instance_count(self) -> int:
        return max(1, sum(group.count for group in self.instance_group)) if self.instance_group else 1

    def input_named(self, name: str) -> TensorConfig | None:
        return next((t for t in self.input if t.name == name), None)

    def output_named(self, name: str) -> TensorConfig | None:
        return next((t for t in self.output if t.name == name), None)


@dataclass(frozen=True)
class TensorSignature:
    """A tensor as the model file declares it: full shape including any batch dimension, -1 for dynamic."""

    name: str
    data_type: str  # Triton DataType name
    shape: tuple[int, ...]
    symbolic_dims: tuple[str | None, ...] = ()  # the symbolic name of each dim where the file has one
    optional: bool = False  # an input the model runs without (ONNX optional(tensor(...)))


@dataclass(frozen=True)
class ModelSignature:
    """What a backend reads from a model file, for auto-complete and for checking a config against it."""

    inputs: tuple[TensorSignature, ...]
    outputs: tuple[TensorSignature, ...]
    # TensorRT: the max batch of the first optimisation profile, when the engine has a dynamic first dim.
    max_batch_hint: int | None = None
    notes: tuple[str, ...] = ()  # e.g. non-linear I/O formats found, reported with auto-complete off
    # ONNX: initializers that are also graph inputs (ORT lists them apart from the inputs); a config may list them
    # as optional inputs, which a request may override or leave out for the file's value, as Triton's ONNX Runtime
    # backend allows; auto-complete leaves them out
    overridable: tuple[TensorSignature, ...] = ()

"""What a TensorRT engine declares, as plain values, and the decisions taken from it. No TensorRT import.

`EngineView` is the narrow face of ``trt.ICudaEngine`` the backend reads (names, modes, dtypes, shapes,
formats, profiles, scratch sizes); `_trt_runtime.TrtEngineView` implements it over a real engine and tests use
a fake. Everything here is pure: binding discovery, dtype mapping, the LINEAR-format rule, optimisation
profile selection, the auto-complete signature and the check of a config against the engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from edged.errors import InvalidInput, ModelLoadError
from edged.repository.model_config import ModelConfig, ModelSignature, TensorSignature

Shape = tuple[int, ...]

# TensorRT DataType names → Triton DataType names. FP8, INT4 and FP4 exist only inside engines, never as I/O.
TRT_TO_TRITON: dict[str, str] = {
    "FLOAT": "TYPE_FP32", "HALF": "TYPE_FP16", "BF16": "TYPE_BF16", "INT8": "TYPE_INT8",
    "INT32": "TYPE_INT32", "INT64": "TYPE_INT64", "BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8",
}
# The numpy dtype of each I/O type edged can move through numpy (no numpy bfloat16).
TRT_TO_NUMPY: dict[str, np.dtype[np.generic]] = {
    "FLOAT": np.dtype(np.float32), "HALF": np.dtype(np.float16), "INT8": np.dtype(np.int8),
    "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64), "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
}
LINEAR = "LINEAR"


class EngineView(Protocol):
    """The part of ``trt.ICudaEngine`` the backend reads; enum values are given by their names."""

    def tensor_names(self) -> tuple[str, ...]: ...
    def is_input(self, name: str) -> bool: ...
    def dtype_name(self, name: str) -> str: ...
    def shape(self, name: str) -> Shape: ...
    def format_name(self, name: str) -> str: ...
    def format_desc(self, name: str) -> str: ...
    def is_shape_tensor(self, name: str) -> bool: ...
    def num_profiles(self) -> int: ...
    def profile_shapes(self, name: str, profile: int) -> tuple[Shape, Shape, Shape]: ...
    def device_memory_size(self) -> int: ...
    def profile_device_memory_size(self, profile: int) -> int | None: ...


@dataclass(frozen=True)
class ProfileRange:
    min: Shape
    opt: Shape
    max: Shape

    def contains(self, shape: Shape) -> bool:
        return len(shape) == len(self.min) and all(
            lo <= dim <= hi for lo, dim, hi in zip(self.min, shape, self.max, strict=True))


@dataclass(frozen=True)
class Binding:
    name: str
    is_input: bool
    dtype: str  # TensorRT DataType name
    shape: Shape  # -1 for each dynamic dimension
    format: str  # TensorRT TensorFormat name
    format_desc: str = ""
    is_shape_tensor: bool = False
    profiles: tuple[ProfileRange, ...] = ()  # inputs only: one range per optimisation profile

    @property
    def triton_type(self) -> str:
        return TRT_TO_TRITON.get(self.dtype, f"TYPE_INVALID({self.dtype})")

    @property
    def is_dynamic(self) -> bool:
        return any(dim < 0 for dim in self.shape)

    @property
    def is_linear(self) -> bool:
        return self.format == LINEAR


def discover_bindings(engine: EngineView) -> tuple[Binding, ...]:
    bindings = []
    profiles = engine.num_profiles()
    for name in engine.tensor_names():
        is_input = engine.is_input(name)
        ranges = tuple(ProfileRange(*engine.profile_shapes(name, p)) for p in range(profiles)) \
            if is_input and not engine.is_shape_tensor(name) else ()
        bindings.append(Binding(
            name=name, is_input=is_input, dtype=engine.dtype_name(name), shape=engine.shape(name),
            format=engine.format_name(name), format_desc=engine.format_desc(name),
            is_shape_tensor=engine.is_shape_tensor(name), profiles=ranges))
    return tuple(bindings)


def is_non_linear_format_io(binding: Binding) -> bool:
    return not binding.is_linear


def format_note(binding: Binding) -> str:
    desc = f" ({binding.format_desc})" if binding.format_desc else ""
    return (f"{'input' if binding.is_input else 'output'} {binding.name!r} uses TensorRT format "
            f"{binding.format}{desc}, not LINEAR: edged cannot serve it; rebuild the engine without "
            f"--inputIOFormats/--outputIOFormats (or BuilderFlag.DIRECT_IO) so that I/O stays LINEAR")


def check_servable(model: str, bindings: Sequence[Binding]) -> None:
    """Refuse, at load, engines whose I/O edged cannot move: non-LINEAR layouts, shape tensors, odd dtypes."""
    problems = [format_note(b) for b in bindings if is_non_linear_format_io(b)]
    problems += [f"input {b.name!r} is a shape tensor, which edged does not support"
                 for b in bindings if b.is_shape_tensor]
    problems += [f"{'input' if b.is_input else 'output'} {b.name!r} has type {b.dtype}; edged supports "
                 f"{', '.join(TRT_TO_NUMPY)}" for b in bindings if b.dtype not in TRT_TO_NUMPY]
    if problems:
        raise ModelLoadError(f"model {model!r}: the TensorRT engine cannot be served: " + "; ".join(problems))


def max_batch_hint(bindings: Sequence[Binding]) -> int | None:
    """The first profile's max batch, when every input's first dimension is dynamic."""
    inputs = [b for b in bindings if b.is_input and b.profiles]
    if not inputs or any(not b.shape or b.shape[0] >= 0 for b in inputs):
        return None
    return min(b.profiles[0].max[0] for b in inputs)


def signature(bindings: Sequence[Binding]) -> ModelSignature:
    def tensor(b: Binding) -> TensorSignature:
        return TensorSignature(name=b.name, data_type=b.triton_type, shape=b.shape)

    return ModelSignature(
        inputs=tuple(tensor(b) for b in bindings if b.is_input),
        outputs=tuple(tensor(b) for b in bindings if not b.is_input),
        max_batch_hint=max_batch_hint(bindings),
        notes=tuple(format_note(b) for b in bindings if is_non_linear_format_io(b)),
    )


def _dims_match(config_dims: Shape, engine_shape: Shape) -> bool:
    return len(config_dims) == len(engine_shape) and all(
        e < 0 or c < 0 or c == e for c, e in zip(config_dims, engine_shape, strict=True))


def check_config(config: ModelConfig, bindings: Sequence[Binding]) -> None:
    """Every configured tensor exists in the engine with the same type and compatible dims."""
    by_name = {b.name: b for b in bindings}
    problems: list[str] = []
    batch: Shape = (-1,) if config.max_batch_size > 0 else ()
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for tensor in tensors:
            binding = by_name.get(tensor.name)
            if binding is None or binding.is_input != (kind == "input"):
                names = sorted(b.name for b in bindings if b.is_input == (kind == "input"))
                problems.append(f"{kind} {tensor.name!r} is not an engine {kind} (engine has {names})")
                continue
            if tensor.data_type != binding.triton_type:
                problems.append(f"{kind} {tensor.name!r}: config says {tensor.data_type}, engine has "
                                f"{binding.triton_type}")
            dims = tuple(tensor.reshape.shape) if tensor.reshape is not None else tensor.dims
            if not _dims_match(batch + dims, binding.shape):
                problems.append(f"{kind} {tensor.name!r}: config dims {list(batch + dims)} (with batch) "
                                f"do not fit engine shape {list(binding.shape)}")
    problems += _batch_problems(config, bindings)
    if problems:
        raise ModelLoadError(f"model {config.name!r}: config.pbtxt does not match the engine: "
                             + "; ".join(problems))


def _batch_problems(config: ModelConfig, bindings: Sequence[Binding]) -> list[str]:
    if config.max_batch_size <= 0:
        return []
    problems = []
    for b in bindings:
        if not b.is_input or not b.profiles:
            continue
        if b.shape and b.shape[0] >= 0 and b.shape[0] < config.max_batch_size:
            problems.append(f"input {b.name!r} has a fixed batch of {b.shape[0]} but max_batch_size is "
                            f"{config.max_batch_size}")
        elif b.shape and not any(p.max[0] >= config.max_batch_size for p in b.profiles):
            best = max(p.max[0] for p in b.profiles)
            problems.append(f"max_batch_size {config.max_batch_size} exceeds the largest batch {best} any "
                            f"optimisation profile allows for input {b.name!r}")
    return problems


def select_profile(bindings: Sequence[Binding], shapes: Mapping[str, Shape], current: int = 0) -> int:
    """The first profile whose [min, max] contains every input shape (the current one if it does)."""
    inputs = [b for b in bindings if b.is_input and b.profiles]
    if not inputs:
        return current
    count = len(inputs[0].profiles)
    missing = [b.name for b in inputs if b.name not in shapes]
    if missing:
        raise InvalidInput(f"missing input(s) {missing} for the TensorRT engine")

    def fits(profile: int) -> bool:
        return all(b.profiles[profile].contains(shapes[b.name]) for b in inputs)

    order = [current] + [p for p in range(count) if p != current] if 0 <= current < count else range(count)
    for profile in order:
        if fits(profile):
            return profile
    ranges = "; ".join(
        f"profile {p}: " + ", ".join(f"{b.name} min {list(b.profiles[p].min)} max {list(b.profiles[p].max)}"
                                     for b in inputs) for p in range(count))
    found = ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
    raise InvalidInput(f"no optimisation profile of the engine accepts the input shapes ({found}); {ranges}")

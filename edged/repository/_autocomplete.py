"""Auto-completing a model config from the signature a backend reads from the model file, like Triton.

Follows ModelState::AutoCompleteConfig / AutoCompleteMaxBatch / AutoCompleteIO of Triton's ONNX Runtime
backend (triton-inference-server/onnxruntime_backend, src/onnxruntime.cc):
- a model "can batch" when every input and output has a first dimension of -1;
- if it can and the config gives no max_batch_size (0), max_batch_size becomes the backend's
  ``default-max-batch-size``, which is 4 unless configured (Triton's qa/L0_backend_config expects 4 with no
  flag); if it then exceeds 1 and no scheduler is configured, an empty dynamic_batching is added;
- if it cannot, a non-zero max_batch_size is an error;
- missing inputs/outputs are written from the signature with the batch dimension dropped when batching;
  a tensor left with no dims gets dims [1] and, when batching, an empty reshape (a per-item scalar);
- initializers that are also graph inputs (``ModelSignature.overridable``) are never added, but a config may
  list them as inputs, as Triton merges them into the inputs a request may give.
Unlike Triton, edged also checks configured tensors against the model (missing tensor, data type, dims), so a
wrong config fails at validation rather than at the first request. For TensorRT, the engine's profile max
batch (``ModelSignature.max_batch_hint``) replaces the default. Then Triton's normalization is applied.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from edged.errors import ModelConfigError
from edged.repository._normalize import BACKEND_PLATFORMS, PLATFORM_BACKENDS, normalize
from edged.repository.model_config import (
    BACKEND_DEFAULT_FILENAME,
    DynamicBatching,
    ModelConfig,
    ModelSignature,
    Reshape,
    TensorConfig,
    TensorSignature,
)

logger = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_SIZE = 4


def autocomplete(config: ModelConfig | None, name: str, signature: ModelSignature, runtime: str, *,
                 default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
                 gpus: Sequence[int] = ()) -> ModelConfig:
    """Fill what the config leaves out from the model's signature, check the rest against it, normalize."""
    config = _runtime_fields(config or ModelConfig(name=name), name, runtime)
    inputs_given, outputs_given = bool(config.input), bool(config.output)
    if not (inputs_given and outputs_given):
        config = _max_batch(config, signature, default_max_batch_size)
    batch = config.max_batch_size > 0
    config = replace(
        config,
        input=_complete(config.input, signature.inputs, batch, "input", config.name, signature.overridable),
        output=_complete(config.output, signature.outputs, batch, "output", config.name),
    )
    return normalize(config, gpus)


def _runtime_fields(config: ModelConfig, name: str, runtime: str) -> ModelConfig:
    if not config.name:
        config = replace(config, name=name)
    known = config.backend or PLATFORM_BACKENDS.get(config.platform, "")
    if known and known != runtime:
        raise ModelConfigError(f"model '{config.name}': the config names runtime '{known}' but the model "
                               f"file is for '{runtime}'")
    backend = config.backend or runtime
    platform = config.platform or BACKEND_PLATFORMS.get(backend, "")
    filename = config.default_model_filename or BACKEND_DEFAULT_FILENAME.get(backend, "")
    if platform == "torch_export" and not config.default_model_filename:
        filename = "model.pt2"
    return replace(config, backend=backend, platform=platform, default_model_filename=filename)


def _can_batch(signature: ModelSignature) -> bool:
    tensors = (*signature.inputs, *signature.outputs)
    return bool(tensors) and all(t.shape and t.shape[0] == -1 for t in tensors)  # a generative model has none


def _max_batch(config: ModelConfig, signature: ModelSignature, default: int) -> ModelConfig:
    if not _can_batch(signature):
        if config.max_batch_size != 0:
            raise ModelConfigError(f"model '{config.name}': max_batch_size is {config.max_batch_size} but "
                                   "the model cannot batch (not every input and output has a variable first "
                                   "dimension); expected max_batch_size 0")
        return config
    if config.max_batch_size == 0:
        size = signature.max_batch_hint if signature.max_batch_hint is not None else max(default, 0)
        logger.warning("model %s: max_batch_size auto-completed to %d; set max_batch_size in config.pbtxt "
                       "for a larger batch", config.name, size)
        config = replace(config, max_batch_size=size)
    scheduled = config.dynamic_batching is not None or "sequence_batching" in config.extra
    if config.max_batch_size > 1 and not scheduled:
        config = replace(config, dynamic_batching=DynamicBatching())
    return config


def _complete(given: tuple[TensorConfig, ...], found: tuple[TensorSignature, ...], batch: bool, kind: str,
              model: str, overridable: tuple[TensorSignature, ...] = ()) -> tuple[TensorConfig, ...]:
    if not given:
        return tuple(_from_signature(t, batch) for t in found)
    by_name = {t.name: t for t in found}
    initializers = {t.name: t for t in overridable}
    out: list[TensorConfig] = []
    for tensor in given:
        sig = by_name.get(tensor.name)
        if sig is None and tensor.name in initializers:
            if not tensor.optional:  # Triton counts it out of the model's inputs only when it is optional
                raise ModelConfigError(f"model '{model}': {kind} '{tensor.name}' is an initializer of the model file "
                                       "(it has a default value): mark it optional: true, so that a request may "
                                       "leave it out for that value or give its own")
            sig = initializers[tensor.name]
        if sig is None:
            raise ModelConfigError(f"model '{model}': {kind} '{tensor.name}' is in the config but not in the "
                                   f"model file; the model's {kind}s are: {', '.join(by_name) or 'none'}")
        out.append(_check(tensor, sig, batch, kind, model))
    return tuple(out)


def _from_signature(sig: TensorSignature, batch: bool) -> TensorConfig:
    dims = tuple(sig.shape[1:] if batch else sig.shape)
    if dims:
        return TensorConfig(name=sig.name, data_type=sig.data_type, dims=dims, optional=sig.optional)
    return TensorConfig(name=sig.name, data_type=sig.data_type, dims=(1,),
                        reshape=Reshape(()) if batch else None, optional=sig.optional)


def _check(tensor: TensorConfig, sig: TensorSignature, batch: bool, kind: str, model: str) -> TensorConfig:
    label = f"model '{model}': {kind} '{tensor.name}'"
    if tensor.data_type == "TYPE_INVALID":
        tensor = replace(tensor, data_type=sig.data_type)
    elif tensor.data_type != sig.data_type:
        raise ModelConfigError(f"{label} has data_type {tensor.data_type} in the config but "
                               f"{sig.data_type} in the model file")
    if not tensor.dims:
        return replace(tensor, dims=_from_signature(sig, batch).dims)
    shape = tensor.reshape.shape if tensor.reshape is not None else tensor.dims
    full = ((-1,) if batch else ()) + tuple(shape)
    if batch and sig.shape and sig.shape[0] != -1:
        raise ModelConfigError(f"{label}: max_batch_size > 0 needs a variable first dimension in the model, "
                               f"found shape {list(sig.shape)}")
    if len(full) != len(sig.shape) or any(m not in (-1, c) for c, m in zip(full, sig.shape, strict=True)):
        raise ModelConfigError(f"{label} has shape {list(full)} in the config (batch dimension included) but "
                               f"{list(sig.shape)} in the model file")
    return tensor

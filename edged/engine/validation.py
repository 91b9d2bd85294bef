"""Checks every request against its model's config before it is queued.

A request that fails here never reaches a batch. Messages name the model, the tensor, what was expected and
what was found, in the same words for every front end.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from edged.engine.types import Array, InferRequest
from edged.errors import InvalidInput, PayloadTooLarge
from edged.repository.datatypes import TRITON_TO_NUMPY
from edged.repository.model_config import ModelConfig, TensorConfig


class InputPlan(NamedTuple):
    """What validation found: the request's batch size and the arrays to run (reshaped where configured).

    A NamedTuple rather than a frozen dataclass: as immutable, and built once per request at a third of the cost.
    """

    batch_size: int
    inputs: dict[str, Array]
    signature: tuple[Any, ...]  # equal signatures can share a batch


class RequestValidator:
    def __init__(self, config: ModelConfig, max_elements: int) -> None:
        self._config = config
        self._model = config.name
        self._max_elements = max_elements
        self._batching = config.max_batch_size > 0
        self._inputs = {t.name: t for t in config.input}
        self._required = tuple(t.name for t in config.input if not t.optional)
        self._outputs = {t.name for t in config.output}
        self._dtypes = {t.name: TRITON_TO_NUMPY.get(t.data_type) for t in config.input}
        # The shape a request may have, per input, when the config has no variable dimension: one tuple
        # comparison then replaces the element-wise match.
        self._exact_dims = {t.name: t.dims for t in config.input if -1 not in t.dims}
        self._reject_nonfinite = config.parameters.get("reject_nonfinite_inputs", "").lower() == "true"

    def check(self, request: InferRequest) -> InputPlan:
        inputs = request.inputs
        for name in self._required:
            if name not in inputs:
                raise InvalidInput(f"model {self._model}: expected input {name!r} is missing from the request "
                                   f"(expected inputs: {', '.join(self._inputs)})")
        batching = self._batching
        batch_size = 0
        prepared: dict[str, Array] = {}
        signature: list[Any] = []
        for name, array in inputs.items():
            spec = self._inputs.get(name)
            if spec is None:
                raise InvalidInput(f"model {self._model}: unexpected input {name!r} "
                                   f"(expected inputs: {', '.join(self._inputs)})")
            shape = array.shape
            if batching:
                batch_size = self._check_batch(spec, array, batch_size)
                shape = shape[1:]
            if (array.dtype != self._dtypes[name] or array.size > self._max_elements or self._reject_nonfinite
                    or shape != self._exact_dims.get(name)):
                self._check_tensor(spec, array)  # the full check, only when the quick one is not conclusive
            prepared[name] = array if spec.reshape is None else self._reshape(spec, array)
            signature.append((name, shape))
        if request.outputs:
            self._check_outputs(request)
        return InputPlan(batch_size if batching else 1, prepared, tuple(signature))

    def _check_outputs(self, request: InferRequest) -> None:
        for output in request.outputs:
            if output.name not in self._outputs:
                raise InvalidInput(f"model {self._model}: unknown requested output {output.name!r} "
                                   f"(outputs: {', '.join(sorted(self._outputs))})")

    def _check_batch(self, spec: TensorConfig, array: Array, batch_size: int) -> int:
        if not self._batching:
            return batch_size
        if array.ndim == 0:
            raise InvalidInput(f"model {self._model}: input {spec.name!r} needs a batch dimension (max_batch_size "
                               f"{self._config.max_batch_size}); found a scalar")
        this = int(array.shape[0])
        if not 1 <= this <= self._config.max_batch_size:
            raise InvalidInput(f"model {self._model}: input {spec.name!r} has batch size {this}, expected 1 to "
                               f"{self._config.max_batch_size} (max_batch_size)")
        if batch_size and this != batch_size:
            raise InvalidInput(f"model {self._model}: input {spec.name!r} has batch size {this} but other inputs "
                               f"have {batch_size}; all inputs must share the batch size")
        return this

    def _check_tensor(self, spec: TensorConfig, array: Array) -> None:
        expected_dtype = self._dtypes[spec.name]
        if (expected_dtype is not None and array.dtype != expected_dtype
                and not (expected_dtype == np.object_ and array.dtype.kind in "OSU")):
            raise InvalidInput(f"model {self._model}: input {spec.name!r} has datatype "
                                   f"{_kserve_name(array.dtype)}, expected {spec.datatype}")
        if array.size > self._max_elements:
            raise PayloadTooLarge(f"model {self._model}: input {spec.name!r} has {array.size} elements, more than "
                                  f"the limit of {self._max_elements}")
        shape = array.shape[1:] if self._batching else array.shape
        if not _shape_matches(shape, spec.dims):
            shown_expected = ([-1] if self._batching else []) + list(spec.dims)
            raise InvalidInput(f"model {self._model}: input {spec.name!r} has shape {list(array.shape)}, "
                               f"expected {shown_expected}")
        if self._reject_nonfinite and array.dtype.kind == "f" and not np.isfinite(array).all():
            raise InvalidInput(f"model {self._model}: input {spec.name!r} contains NaN or Inf, which this model "
                               "does not accept (parameter reject_nonfinite_inputs)")

    def _reshape(self, spec: TensorConfig, array: Array) -> Array:
        if spec.reshape is None:
            return array
        target = tuple(spec.reshape.shape)
        if self._batching:
            target = (array.shape[0], *target)
        try:
            return array.reshape(target)
        except ValueError:
            raise InvalidInput(f"model {self._model}: input {spec.name!r} of shape {list(array.shape)} cannot be "
                               f"reshaped to {list(target)}") from None


def _shape_matches(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    if len(shape) != len(dims):
        return False
    return all(d in (-1, s) for s, d in zip(shape, dims, strict=True))


def _kserve_name(dtype: np.dtype[Any]) -> str:
    names: Mapping[str, str] = {
        "bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
        "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64", "float16": "FP16",
        "float32": "FP32", "float64": "FP64", "object": "BYTES",
    }
    return names.get(dtype.name, dtype.name)

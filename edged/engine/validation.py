"""Checks every request against its model's config before it is queued.

A request that fails here never reaches a batch. Messages name the model, the tensor, what was expected and
what was found, in the same words for every front end.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from edged.engine.types import Array, InferRequest
from edged.errors import InvalidInput, PayloadTooLarge
from edged.repository.datatypes import TRITON_TO_NUMPY
from edged.repository.model_config import ModelConfig, TensorConfig

# What validation found: the request's batch size, the arrays to run (reshaped where configured) and its
# signature (requests with equal signatures can share a batch). A plain tuple: it is built for every request, and
# a NamedTuple costs five times as much to build.
InputPlan = tuple[int, dict[str, Array], tuple[Any, ...]]


class RequestValidator:
    def __init__(self, config: ModelConfig, max_elements: int) -> None:
        self._config = config
        self._model = config.name
        self._max_elements = max_elements
        self._batching = config.max_batch_size > 0
        self._max_batch = config.max_batch_size
        self._inputs = {t.name: t for t in config.input}
        self._required = tuple(t.name for t in config.input if not t.optional)
        self._outputs = {t.name for t in config.output}
        self._dtypes = {t.name: TRITON_TO_NUMPY.get(t.data_type) for t in config.input}
        # The shape a request may have, per input, when the config has no variable dimension: one tuple
        # comparison then replaces the element-wise match.
        self._exact_dims = {t.name: t.dims for t in config.input if -1 not in t.dims}
        self._generative = config.runtime == "onnxruntime_genai"
        self._reject_nonfinite = config.parameters.get("reject_nonfinite_inputs", "").lower() == "true"
        self._no_reshape = all(t.reshape is None for t in config.input)
        # Per input, what the quick check compares: (spec, numpy dtype, exact dims or None when a dimension is
        # variable); one dict lookup per input instead of three.
        self._quick = {t.name: (t, self._dtypes[t.name], self._exact_dims.get(t.name)) for t in config.input}

        # A model with one input of fixed shape (most edge models: one image or feature tensor) gets a check
        # specialised to it: a few comparisons and a constant signature. Anything it does not accept at once
        # goes through the general check, which names the problem.
        single = config.input[0] if len(config.input) == 1 else None
        self._single: tuple[str, Any, tuple[int, ...], tuple[Any, ...]] | None = None
        if (single is not None and single.name in self._exact_dims and single.reshape is None
                and self._dtypes[single.name] is not None and not self._reject_nonfinite):
            dims = self._exact_dims[single.name]
            self._single = (single.name, self._dtypes[single.name], dims, ((single.name, dims),))

    def check(self, request: InferRequest) -> InputPlan:
        single = self._single
        if single is not None and not request.outputs and len(request.inputs) == 1:
            name, dtype, dims, signature = single
            array = request.inputs.get(name)
            if array is not None and array.dtype is dtype and array.size <= self._max_elements:
                shape = array.shape
                if not self._batching:
                    if shape == dims:
                        return 1, {name: array}, signature
                elif shape and 0 < shape[0] <= self._max_batch and shape[1:] == dims:
                    return shape[0], {name: array}, signature
        return self._check(request)

    def _check(self, request: InferRequest) -> InputPlan:
        if self._generative:
            raise InvalidInput(f"model {self._model!r} is generative (backend onnxruntime_genai) and takes no "
                               f"tensors: use POST /v2/models/{self._model}/generate (Triton's generate extension) "
                               "or POST /v1/chat/completions")
        # Requests the single-input check did not take: the common case (known inputs of the configured dtype and
        # fixed shape) costs one pass of cheap comparisons; anything unusual takes the full check, which names
        # the problem.
        inputs = request.inputs
        batching = self._batching
        max_batch = self._max_batch
        max_elements = self._max_elements
        quick = self._quick
        always_full = self._reject_nonfinite
        no_reshape = self._no_reshape
        batch_size = 0
        # a copy even without reshapes: a caller may rebind its dict's entries for its next request meanwhile
        prepared: dict[str, Array] = dict(inputs) if no_reshape else {}
        signature: list[Any] = []
        for name, array in inputs.items():
            known = quick.get(name)
            if known is None:
                raise InvalidInput(f"model {self._model}: unexpected input {name!r} "
                                   f"(expected inputs: {', '.join(self._inputs)})")
            spec, dtype, dims = known
            shape = array.shape
            if batching:
                if not shape or not 0 < shape[0] <= max_batch or (batch_size and shape[0] != batch_size):
                    raise self._batch_error(spec, array, batch_size)
                batch_size = shape[0]
                shape = shape[1:]
            full = always_full or shape != dims or array.size > max_elements
            # `is` first: arrays of a builtin dtype share numpy's descriptor, and `!=` costs ten times as much
            if array.dtype is not dtype and array.dtype != dtype:
                if _other_byte_order(array, dtype):
                    array = prepared[name] = array.astype(dtype)  # the runtimes take native byte order only
                else:
                    full = True
            if full:
                self._check_tensor(spec, array)  # the full check, only when the quick one is not conclusive
            if not no_reshape:
                prepared[name] = array if spec.reshape is None else self._reshape(spec, array)
            signature.append((name, shape))
        if len(inputs) != len(self._inputs):  # all names are known by now: equal counts mean none is missing
            self._check_required(inputs)
        if request.outputs:
            self._check_outputs(request)
        return (batch_size if batching else 1), prepared, tuple(signature)

    def check_shapes(self, shapes: Mapping[str, tuple[np.dtype[Any], tuple[int, ...]]]) -> None:
        """The checks that need no data (names, datatypes, batch size, dims, element limit), for a front end
        to run before it converts a large request's data; `check` still runs on the request itself."""
        batch_size = 0
        for name, (dtype, shape) in shapes.items():
            spec = self._inputs.get(name)
            if spec is None:
                raise InvalidInput(f"model {self._model}: unexpected input {name!r} "
                                   f"(expected inputs: {', '.join(self._inputs)})")
            placeholder = np.broadcast_to(np.zeros((), dtype), shape)  # the shape without its memory
            if self._batching:
                if not shape or not 0 < shape[0] <= self._max_batch or (batch_size and shape[0] != batch_size):
                    raise self._batch_error(spec, placeholder, batch_size)
                batch_size = shape[0]
            self._check_metadata(spec, placeholder)
        self._check_required(shapes)

    def _check_required(self, inputs: Mapping[str, Any]) -> None:
        for name in self._required:
            if name not in inputs:
                raise InvalidInput(f"model {self._model}: expected input {name!r} is missing from the request "
                                   f"(expected inputs: {', '.join(self._inputs)})")

    def _check_outputs(self, request: InferRequest) -> None:
        for output in request.outputs:
            if output.name not in self._outputs:
                raise InvalidInput(f"model {self._model}: unknown requested output {output.name!r} "
                                   f"(outputs: {', '.join(sorted(self._outputs))})")

    def _batch_error(self, spec: TensorConfig, array: Array, batch_size: int) -> InvalidInput:
        if array.ndim == 0:
            return InvalidInput(f"model {self._model}: input {spec.name!r} needs a batch dimension "
                                f"(max_batch_size {self._max_batch}); found a scalar")
        this = int(array.shape[0])
        if not 1 <= this <= self._max_batch:
            return InvalidInput(f"model {self._model}: input {spec.name!r} has batch size {this}, expected 1 to "
                                f"{self._max_batch} (max_batch_size)")
        return InvalidInput(f"model {self._model}: input {spec.name!r} has batch size {this} but other inputs "
                            f"have {batch_size}; all inputs must share the batch size")

    def _check_tensor(self, spec: TensorConfig, array: Array) -> None:
        self._check_metadata(spec, array)
        if self._reject_nonfinite and array.dtype.kind == "f" and not np.isfinite(array).all():
            raise InvalidInput(f"model {self._model}: input {spec.name!r} contains NaN or Inf, which this model "
                               "does not accept (parameter reject_nonfinite_inputs)")

    def _check_metadata(self, spec: TensorConfig, array: Array) -> None:
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

    def reshaped(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        """``inputs`` as the model takes them: each reshaped where its config has a ``reshape``. Warm-up goes
        through this too, so its tensors reach the model in the shape a request's do."""
        if self._no_reshape:
            return dict(inputs)
        return {name: self._reshape(self._inputs[name], array) if name in self._inputs else array
                for name, array in inputs.items()}

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


def _other_byte_order(array: Array, dtype: np.dtype[Any] | None) -> bool:
    """Whether ``array`` holds ``dtype``'s values in the other byte order (e.g. '>f4' for float32)."""
    return dtype is not None and array.dtype.byteorder not in ("=", "|") and array.dtype.newbyteorder("=") == dtype


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

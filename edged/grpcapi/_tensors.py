"""ModelInferRequest → the engine's InferRequest, and InferResponse → ModelInferResponse, as Triton does it.

Rules (Triton's): an input's bytes come from exactly one place: a shared-memory region (its
``shared_memory_*`` parameters), ``raw_input_contents`` (then every input not in shared memory has one entry,
in order) or its typed ``contents``. Sizes are checked against shape and datatype before any array is built:
a raw entry of the wrong length, a count of typed values that does not match the shape, a value out of range
for its datatype, or more elements than ``[server] max_tensor_elements`` is INVALID_ARGUMENT naming the input.
FP16 has no typed field: raw or shared memory only. Responses carry every output in ``raw_output_contents``
(one entry per output, in order; an empty entry for one written to shared memory, so that tritonclient's
positional lookup stays aligned).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edged.engine import InferRequest, InferResponse, RequestedOutput
from edged.errors import InvalidInput, PayloadTooLarge
from edged.grpcapi.proto import grpc_service_pb2 as pb
from edged.protocol import kserve_datatype
from edged.protocol._shapes import MAX_RANK
from edged.protocol.codec import tensor_bytes, tensor_from_bytes
from edged.protocol.datatypes import numpy_for
from edged.protocol.shm_params import ShmReader, ShmReference, shm_reference
from edged.shm import write_output

Array = np.ndarray[Any, Any]
ShmWriter = Callable[[ShmReference], memoryview]

# The typed field each datatype's values travel in, and the numpy type that holds that field's values.
_CONTENTS: dict[str, tuple[str, Any]] = {
    "BOOL": ("bool_contents", np.bool_), "INT8": ("int_contents", np.int64), "INT16": ("int_contents", np.int64),
    "INT32": ("int_contents", np.int64), "INT64": ("int64_contents", np.int64),
    "UINT8": ("uint_contents", np.uint64), "UINT16": ("uint_contents", np.uint64),
    "UINT32": ("uint_contents", np.uint64), "UINT64": ("uint64_contents", np.uint64),
    "FP32": ("fp32_contents", np.float32), "FP64": ("fp64_contents", np.float64), "BYTES": ("bytes_contents", None),
}


@dataclass(frozen=True)
class OutputSpec:
    name: str
    shm: ShmReference | None


@dataclass(frozen=True)
class Decoded:
    request: InferRequest
    outputs: tuple[OutputSpec, ...]


def parameters(params: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    """A protobuf parameter map as plain values (the form the HTTP codec's parameters have)."""
    plain: dict[str, Any] = {}
    for key, value in params.items():
        choice = value.WhichOneof("parameter_choice")
        plain[key] = None if choice is None else getattr(value, choice)
    return plain


def decode_infer(message: pb.ModelInferRequest, max_elements: int, read: ShmReader) -> Decoded:
    if not message.model_name:
        raise InvalidInput("ModelInferRequest: model_name is empty")
    raw = message.raw_input_contents
    inputs: dict[str, Array] = {}
    raw_index = 0
    for tensor in message.inputs:
        if tensor.name in inputs:
            raise InvalidInput(f"input {tensor.name!r} is given more than once")
        array, used_raw = _decode_input(tensor, raw, raw_index, max_elements, read)
        inputs[tensor.name] = array
        raw_index += used_raw
    if raw and raw_index != len(raw):
        raise InvalidInput(f"expected {raw_index} raw_input_contents (one for each input not in shared memory), "
                           f"got {len(raw)}")
    params = parameters(message.parameters)
    outputs = tuple(_output_spec(out) for out in message.outputs)
    requested = tuple(RequestedOutput(out.name, True, _class_count(out)) for out in message.outputs)
    request = InferRequest(message.model_name, inputs, message.model_version, message.id, requested, params,
                           _unsigned(params, "priority"), _unsigned(params, "timeout"))
    return Decoded(request, outputs)


def _decode_input(tensor: pb.ModelInferRequest.InferInputTensor, raw: Sequence[bytes], raw_index: int,
                  max_elements: int, read: ShmReader) -> tuple[Array, int]:
    """(the array, how many raw_input_contents entries it used)."""
    name = tensor.name
    dtype = numpy_for(tensor.datatype, name)
    shape = tuple(tensor.shape)
    if len(shape) > MAX_RANK:  # as the HTTP codec refuses it (numpy could not build a deeper array anyway)
        raise InvalidInput(f"input {name!r}: a shape of {len(shape)} dimensions, more than the limit of {MAX_RANK}")
    count = span = 1
    for dim in shape:
        if dim < 0:
            raise InvalidInput(f"input {name!r}: shape {list(shape)} has a negative dimension")
        count *= dim
        span *= max(dim, 1)  # numpy refuses a shape whose other dimensions overflow, even with a zero in it
    if count > max_elements:
        raise PayloadTooLarge(f"input {name!r} has {count} elements, more than the limit of {max_elements}")
    if span > max_elements:
        raise PayloadTooLarge(f"input {name!r}: shape {list(shape)} is empty, but its other dimensions make more "
                              f"than the limit of {max_elements} elements")
    reference = shm_reference(parameters(tensor.parameters), name, "input") if tensor.parameters else None
    has_contents = tensor.HasField("contents")
    if reference is not None:
        if has_contents:
            raise InvalidInput(f"input {name!r} names a shared memory region and carries contents as well")
        if dtype.kind != "O" and reference.byte_size != count * dtype.itemsize:
            raise InvalidInput(f"input {name!r}: shared_memory_byte_size is {reference.byte_size} bytes, "
                               f"expected {count * dtype.itemsize} for shape {list(shape)} of {tensor.datatype}")
        return tensor_from_bytes(name, read(reference), dtype, shape), 0
    if raw:
        if has_contents:
            raise InvalidInput(f"input {name!r}: contents cannot be used together with raw_input_contents")
        if raw_index >= len(raw):
            raise InvalidInput(f"input {name!r} has no raw_input_contents entry ({len(raw)} given)")
        return tensor_from_bytes(name, memoryview(raw[raw_index]), dtype, shape), 1
    return _from_contents(tensor, dtype, shape, count), 0


def _from_contents(tensor: pb.ModelInferRequest.InferInputTensor, dtype: np.dtype[Any], shape: tuple[int, ...],
                   count: int) -> Array:
    name, datatype = tensor.name, tensor.datatype
    spec = _CONTENTS.get(datatype)
    if spec is None:
        raise InvalidInput(f"input {name!r}: {datatype} has no typed contents field; send it in "
                           "raw_input_contents")
    field, holder = spec
    values = getattr(tensor.contents, field)
    if len(values) != count:
        raise InvalidInput(f"input {name!r}: {len(values)} values in contents.{field}, expected {count} for shape "
                           f"{list(shape)}")
    if holder is None:
        flat = np.empty(count, dtype=object)
        flat[:] = list(values)
        return flat.reshape(shape)
    wide = np.asarray(values, dtype=holder)
    converted = wide.astype(dtype)
    if dtype.kind in "iu" and not np.array_equal(converted, wide):
        raise InvalidInput(f"input {name!r}: a value in contents.{field} does not fit in {datatype}")
    return converted.reshape(shape)


def _output_spec(output: pb.ModelInferRequest.InferRequestedOutputTensor) -> OutputSpec:
    params = parameters(output.parameters) if output.parameters else {}
    reference = shm_reference(params, output.name, "output") if params else None
    if reference is not None and params.get("classification"):
        raise InvalidInput(f"output {output.name!r}: Output can't set both 'shared_memory_region' and "
                           "'classification'")
    return OutputSpec(output.name, reference)


def _class_count(output: pb.ModelInferRequest.InferRequestedOutputTensor) -> int:
    if "classification" not in output.parameters:
        return 0
    return _unsigned(parameters(output.parameters), "classification")


def _unsigned(params: Mapping[str, Any], key: str) -> int:
    value = params.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"parameter {key!r} must be a non-negative int64_param, found {value!r}")
    return value


def encode_infer(result: InferResponse, outputs: Sequence[OutputSpec], write: ShmWriter) -> pb.ModelInferResponse:
    placed = {spec.name: spec.shm for spec in outputs if spec.shm is not None}
    response = pb.ModelInferResponse(model_name=result.model, model_version=result.version, id=result.id)
    for name, array in result.outputs.items():
        entry = response.outputs.add(name=name, datatype=kserve_datatype(array), shape=array.shape)
        reference = placed.get(name)
        if reference is None:
            response.raw_output_contents.append(tensor_bytes(array))
            continue
        write_output(name, array, write(reference))
        entry.parameters["shared_memory_region"].string_param = reference.region
        entry.parameters["shared_memory_byte_size"].int64_param = reference.byte_size
        if reference.offset:
            entry.parameters["shared_memory_offset"].int64_param = reference.offset
        response.raw_output_contents.append(b"")
    return response

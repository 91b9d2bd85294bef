"""Repeated ModelInfer layouts: a request or response whose bytes around the tensors repeat skips protobuf.

A client in a loop (perf_analyzer, a camera pipeline) sends the same model, inputs' names, datatypes and shapes,
and requested outputs every time: only the tensors' bytes change. Protobuf serialises fields in number order, so
``raw_input_contents`` (field 7 of ModelInferRequest, the last) is the message's tail and what precedes it, the
*prefix*, is byte-identical from one request to the next, but for the request's ``id`` (field 3), which a
streaming client sets per request (perf_analyzer --streaming numbers them): layouts are keyed without it and the
id is read from each request's bytes. Likewise a response's model, version and outputs' metadata precede
``raw_output_contents`` (field 6 of ModelInferResponse, the last), with the id between them.

Invariants:
- A layout is a pure function of the bytes it is keyed by: a request's prefix less its one id field (with
  ``[server] max_tensor_elements``, fixed per server; the id decides nothing the parser checks but its UTF-8,
  which is checked per request) or a response's model, version and each output's name, numpy dtype and shape.
  So the caches may be shared by every connection: no request reuses anything another request's bytes
  did not also determine. Access decisions are not made here (they are the call's, from its headers).
- A request takes the fast path only when its prefix (less the id) equals one that protobuf's parser and
  ``decode_infer`` accepted, every input of that layout took its bytes from ``raw_input_contents``, and its tail
  is exactly one field-7 entry per input, each of the byte length the input's datatype and shape need, ending
  the message. A prefix with two id fields goes to the parser (the last one wins there).
  Anything else (another field in the tail, unknown fields, a length off by one, shared memory, typed contents)
  goes through protobuf's parser and ``decode_infer`` as before, which give the errors.
- A response takes the fast path unless an output goes to shared memory; its bytes parse to the message
  ``encode_infer`` builds (tests/grpcapi/test_grpcapi_layouts.py compares them).
- Both caches are bounded: ``_ENTRIES`` layouts each, a request or response prefix of at most ``_PREFIX_BYTES`` (a
  request id is the client's and may be long); a full cache is cleared, so a client alternating layouts costs the
  parser's path, never memory.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from edged.engine import InferRequest, InferResponse
from edged.errors import InvalidInput
from edged.grpcapi._tensors import Decoded, OutputSpec, ShmWriter, decode_infer, encode_infer
from edged.grpcapi.proto import grpc_service_pb2 as pb
from edged.protocol import kserve_datatype
from edged.protocol.codec import tensor_bytes
from edged.protocol.shm_params import ShmReader

_ENTRIES = 64
_PREFIX_BYTES = 4096
_RAW_INPUT_TAG = 7 << 3 | 2  # field 7, length-delimited
_RAW_OUTPUT_TAG = 6 << 3 | 2  # field 6, length-delimited
_RAW_OUTPUT_HEAD = bytes((_RAW_OUTPUT_TAG,))
_ID_HEAD = bytes((3 << 3 | 2,))  # ModelInferResponse.id: field 3, length-delimited
_LITTLE_ENDIAN = ("<", "|", "=") if sys.byteorder == "little" else ("<", "|")
# ModelInferRequest's fields 1-6 are all length-delimited: their one-byte tags
_PREFIX_TAGS = frozenset(number << 3 | 2 for number in range(1, 7))
_ID_TAG = 3 << 3 | 2  # ModelInferRequest.id, field 3: a streaming client's per-request id, kept out of the key

Array = np.ndarray[Any, Any]
# name, wire dtype, shape, byte length, and the field-7 tag and length that must precede its bytes
_Input = tuple[str, np.dtype[Any], tuple[int, ...], int, bytes]


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it; (-1, pos) when it runs past the end or is over 5 bytes."""
    value = shift = 0
    end = min(len(data), pos + 5)
    while pos < end:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    return -1, pos


def raw_start(data: bytes) -> tuple[int, int, int]:
    """Where ``raw_input_contents`` begins in a serialised ModelInferRequest whose top-level fields before it are
    fields 1-6 with one-byte tags, and where its one ``id`` field (3) begins and ends ((0, 0) without one); -1
    for any other shape, a repeated id included (the parser's path)."""
    pos, size = 0, len(data)
    id_start = id_end = 0
    while pos < size:
        tag = data[pos]
        if tag == _RAW_INPUT_TAG:
            return pos, id_start, id_end
        if tag not in _PREFIX_TAGS or pos + 1 >= size:
            return -1, 0, 0
        start = pos
        length = data[pos + 1]  # a one-byte length, the usual case, without a call
        if length < 0x80:
            pos += 2 + length
        else:
            length, pos = _varint(data, pos + 1)
            if length < 0:
                return -1, 0, 0
            pos += length
        if tag == _ID_TAG:
            if id_end:
                return -1, 0, 0
            id_start, id_end = start, pos
    return (-1 if pos > size else pos), id_start, id_end


class RequestLayout:
    __slots__ = ("id", "inputs", "model", "outputs", "parameters", "prefix", "priority", "requested", "timeout_us",
                 "version")

    def __init__(self, prefix: bytes, decoded: Decoded) -> None:
        self.prefix = prefix
        request = decoded.request
        self.model, self.version, self.id = request.model, request.version, request.id
        self.inputs: tuple[_Input, ...] = tuple(
            (name, array.dtype, array.shape, array.nbytes, bytes((_RAW_INPUT_TAG,)) + encode_varint(array.nbytes))
            for name, array in request.inputs.items())
        self.outputs = decoded.outputs
        self.requested = request.outputs
        self.parameters = dict(request.parameters)  # its own: the first request's went to the engine
        self.priority, self.timeout_us = request.priority, request.timeout_us

    def decode(self, data: bytes, pos: int, request_id: str | None = None) -> Decoded | None:
        """The request whose raw contents start at ``pos`` (its id ``request_id``; None: the layout's), or None
        unless the tail is exactly this layout's."""
        view = memoryview(data)
        inputs: dict[str, Array] = {}
        size = len(data)
        for name, dtype, shape, nbytes, head in self.inputs:
            # the tag and the length's varint as the layout's input needs them, compared in one slice
            end = pos + len(head)
            if data[pos:end] != head or end + nbytes > size:
                return None
            pos = end + nbytes
            inputs[name] = np.frombuffer(view[end:pos], dtype).reshape(shape)
        if pos != size:
            return None
        request = InferRequest(self.model, inputs, self.version, self.id if request_id is None else request_id,
                               self.requested, dict(self.parameters),
                               self.priority, self.timeout_us)
        return Decoded(request, self.outputs)


class RequestLayouts:
    """ModelInferRequest bytes → ``Decoded``, through a cached layout where the prefix repeats."""

    __slots__ = ("_cache", "_last", "_max_elements", "_read", "hits")

    def __init__(self, max_elements: int, read: ShmReader) -> None:
        self._max_elements = max_elements
        self._read = read
        self._cache: dict[bytes, RequestLayout] = {}
        self._last: RequestLayout | None = None  # the layout used last, tried first
        self.hits = 0  # requests served from a layout: for tests and benchmarks

    def decode(self, data: bytes) -> Decoded:
        """Raises InvalidInput (INVALID_ARGUMENT) for a message protobuf does not parse or Triton would refuse."""
        last = self._last
        # A message that opens with a stored prefix has its raw contents where that prefix ends (walking its
        # fields goes through the prefix's own), so the walk and the lookup are skipped for it.
        if last is not None and data.startswith(last.prefix):
            decoded = last.decode(data, len(last.prefix))
            if decoded is not None:
                self.hits += 1
                return decoded
        pos, id_start, id_end = raw_start(data)
        key = b""
        request_id: str | None = None
        if 0 < pos <= _PREFIX_BYTES:
            # the id is each request's own on a stream (perf_analyzer --streaming numbers them): the layout is
            # keyed by the prefix without it and the id is read from the bytes
            key = data[:id_start] + data[id_end:pos] if id_end else data[:pos]
            request_id = _request_id(data, id_start, id_end) if id_end else ""
        layout = self._cache.get(key) if key and request_id is not None else None
        if layout is not None:
            decoded = layout.decode(data, pos, request_id)
            if decoded is not None:
                self.hits += 1
                self._last = layout
                return decoded
        try:
            message = pb.ModelInferRequest.FromString(data)
        except DecodeError as e:
            raise InvalidInput(f"the request is not a valid ModelInferRequest message: {e}") from e
        decoded = decode_infer(message, self._max_elements, self._read)
        if key and request_id is not None and layout is None and _all_raw(message, decoded):
            layout = RequestLayout(data[:pos], decoded)
            # Kept only if the tail is nothing but the raw contents: a field after them (a second model_name,
            # last one wins) would otherwise be folded into a layout that requests without it reuse.
            if layout.decode(data, pos) is not None:
                if len(self._cache) >= _ENTRIES:
                    self._cache.clear()
                self._cache[key] = layout
                self._last = layout
        return decoded


def _request_id(data: bytes, start: int, end: int) -> str | None:
    """The id field's value at ``data[start:end]`` (its tag, length and UTF-8 bytes); None if not UTF-8."""
    _, value_start = _varint(data, start + 1)
    try:
        return data[value_start:end].decode()
    except UnicodeDecodeError:
        return None  # the parser's path, which refuses it


def _all_raw(message: pb.ModelInferRequest, decoded: Decoded) -> bool:
    """Every input took its bytes from ``raw_input_contents`` (none from shared memory or typed contents) and
    holds numbers (BYTES elements are length-prefixed inside their entry: the parser's path)."""
    inputs = decoded.request.inputs
    return (len(message.raw_input_contents) == len(inputs) == len(message.inputs)
            and all(array.dtype.kind != "O" for array in inputs.values()))


class ResponseLayouts:
    """InferResponse → serialised ModelInferResponse, its prefix cached by model, version and outputs (the id,
    field 3, is put between the cached bytes of fields 1-2 and those of 4-5: a stream's ids differ per request)."""

    __slots__ = ("_cache", "hits")

    def __init__(self) -> None:
        # the bytes before the id, those after it, and whether tobytes() will do
        self._cache: dict[tuple[Any, ...], tuple[bytes, bytes, bool]] = {}
        self.hits = 0

    def encode(self, result: InferResponse, outputs: Sequence[OutputSpec], write: ShmWriter) -> bytes:
        if outputs and any(spec.shm is not None for spec in outputs):
            return encode_infer(result, outputs, write).SerializeToString()
        arrays = result.outputs
        key: tuple[Any, ...] = (result.model, result.version)
        for name, array in arrays.items():
            key += (name, array.dtype, array.shape)
        layout = self._cache.get(key)
        if layout is None:
            head, tail = _prefix(result)
            layout = head, tail, all(_plain(array.dtype) for array in arrays.values())
            if len(head) + len(tail) <= _PREFIX_BYTES:
                if len(self._cache) >= _ENTRIES:
                    self._cache.clear()
                self._cache[key] = layout
        else:
            self.hits += 1
        head, tail, plain = layout
        parts = [head]
        if result.id:
            request_id = result.id.encode()
            parts.append(_ID_HEAD + encode_varint(len(request_id)) + request_id)
        parts.append(tail)
        for array in arrays.values():
            raw = array.tobytes() if plain else tensor_bytes(array)
            size = len(raw)
            parts.append(bytes((_RAW_OUTPUT_TAG, size)) if size < 0x80 else _RAW_OUTPUT_HEAD + encode_varint(size))
            parts.append(raw)
        return b"".join(parts)


def _plain(dtype: np.dtype[Any]) -> bool:
    """Whether ``tobytes()`` is already the wire form (``tensor_bytes``' first case): numbers, little-endian."""
    return dtype.kind not in "OSU" and dtype.byteorder in _LITTLE_ENDIAN


def _prefix(result: InferResponse) -> tuple[bytes, bytes]:
    """ModelInferResponse's fields before the id (model name, version) and after it (the outputs' metadata),
    serialised: protobuf writes fields in number order, so head + id + tail is the message's prefix."""
    head = pb.ModelInferResponse(model_name=result.model, model_version=result.version).SerializeToString()
    response = pb.ModelInferResponse()
    for name, array in result.outputs.items():
        response.outputs.add(name=name, datatype=kserve_datatype(array), shape=array.shape)
    return head, response.SerializeToString()


def encode_varint(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)

"""Encode and decode KServe v2 inference requests and responses.

JSON tensors carry ``data`` as a flat row-major list (nested lists are accepted and flattened, as Triton
does). With the binary-data extension the JSON header is followed by raw tensor bytes: the header's length is
the ``Inference-Header-Content-Length`` HTTP header (or its MQTT equivalent), and each binary tensor's
``parameters.binary_data_size`` gives its byte count, in the order of the tensors. BYTES elements are each
prefixed with a 4-byte little-endian length, both in binary data and in responses.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Protocol

import numpy as np
import orjson

from edged.errors import InvalidInput
from edged.protocol._jsondata import SPLIT_MIN_BYTES, CutArrays, Unmatched, parse_pieces, split_data
from edged.protocol._jsonvalues import bytes_from_json, numbers_from_json
from edged.protocol._nonfinite import data_fragment, has_nonfinite, loads
from edged.protocol._shapes import element_count, shape_of
from edged.protocol.datatypes import KSERVE_TO_NUMPY, kserve_datatype, numpy_for
from edged.protocol.shm_params import ShmReader, ShmReference, shm_reference

Array = np.ndarray[Any, Any]

_LENGTH = struct.Struct("<I")
# BYTES tensors of this many elements or more are encoded and decoded by numpy, not element by element
_VECTOR_MIN = 64
_PIECE = 64 * 1024  # ... that many at a time
_BOM = b"\xef\xbb\xbf"  # UTF-8 byte order mark
# Tables built once so that the per-tensor work is a dict lookup: the little-endian dtype binary data of each
# dtype is read as, and the KServe name of each numeric dtype in either byte order.
# On a little-endian machine that is the native dtype object itself, not an equal copy: the engine's quick
# input check compares dtypes by identity, and a copy sent every binary request to the full check.
_WIRE_DTYPES: dict[np.dtype[Any], np.dtype[Any]] = {
    dtype: dtype if sys.byteorder == "little" or dtype.byteorder == "|" else dtype.newbyteorder("<")
    for dtype in KSERVE_TO_NUMPY.values()
}
_DATATYPE_NAMES: dict[np.dtype[Any], str] = {
    variant: name for name, dtype in KSERVE_TO_NUMPY.items() if dtype.kind not in "OSU"
    for variant in (dtype, dtype.newbyteorder("<"), dtype.newbyteorder(">"))
}
_LITTLE_ENDIAN_ORDERS = frozenset("<|=") if sys.byteorder == "little" else frozenset("<|")


@dataclass(frozen=True)
class OutputRequest:
    name: str
    binary_data: bool | None = None
    class_count: int = 0
    shm: ShmReference | None = None  # written into a shared-memory region instead of the response body


@dataclass(slots=True)
class DecodedRequest:
    """The fields of an infer request; front ends turn them into the engine's InferRequest."""

    inputs: dict[str, Array]
    outputs: tuple[OutputRequest, ...] = ()
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    timeout_us: int = 0
    binary_outputs: dict[str, bool] = field(default_factory=dict)  # per-output binary_data flags
    binary_default: bool = False  # request-level parameters.binary_data_output


# A model's checks that need only each input's dtype and shape (see decode_request).
Precheck = Callable[[dict[str, tuple[np.dtype[Any], tuple[int, ...]]]], None]


class ResponseLike(Protocol):
    model: str
    version: str
    id: str
    outputs: dict[str, Array]
    parameters: dict[str, Any]


def decode_request(body: bytes | bytearray, header_length: int | None, max_elements: int = 64 * 1024 * 1024,
                   precheck: Precheck | None = None, shm: ShmReader | None = None) -> DecodedRequest:
    """Parse an infer request body; every problem is an InvalidInput naming the tensor and the field.

    ``precheck`` gets every input's dtype and shape once the header is parsed and before any data is
    converted: a model's own checks there refuse a large body that does not fit it before it costs anything.
    ``shm`` resolves inputs that name a shared-memory region; without it such inputs are refused.
    """
    if header_length is not None and not 0 < header_length <= len(body):
        raise InvalidInput(f"Inference-Header-Content-Length is {header_length} but the body has {len(body)} "
                           "bytes")
    if header_length is None and len(body) >= SPLIT_MIN_BYTES:
        split = split_data(body)  # large JSON data arrays straight to numpy, not through Python floats
        if split is not None:
            try:
                return _decode(body, split[0], None, max_elements, precheck, CutArrays(split[1]), shm)
            except Unmatched:
                pass  # a placeholder the client wrote, or "data" outside an input: parse the whole body
    header = body if header_length is None else body[:header_length]
    return _decode(body, header, header_length, max_elements, precheck, shm=shm)


def _decode(body: bytes | bytearray, header_bytes: bytes | bytearray, header_length: int | None, max_elements: int,
            precheck: Precheck | None, cut: CutArrays | None = None, shm: ShmReader | None = None) -> DecodedRequest:
    if header_bytes[:3] == _BOM:  # as Triton reads it: Windows tools save JSON files with one
        header_bytes = header_bytes[3:]
    try:
        doc = loads(header_bytes)
    except orjson.JSONDecodeError as e:
        raise InvalidInput(f"request body is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidInput("request body must be a JSON object with an \"inputs\" list")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInput("request must have a non-empty \"inputs\" list")
    if precheck is not None:
        precheck({meta[0]: (meta[2], meta[3]) for meta in (_tensor_meta(e, max_elements) for e in raw_inputs)})
    binary = memoryview(body)[header_length:] if header_length is not None else memoryview(b"")
    offset = 0
    inputs: dict[str, Array] = {}
    for entry in raw_inputs:
        name, array, used = _decode_input(entry, binary, offset, max_elements, cut, shm)
        if name in inputs:
            raise InvalidInput(f"input {name!r} appears twice in the request")
        inputs[name] = array
        offset += used
    if offset != len(binary):
        raise InvalidInput(f"binary data is {len(binary)} bytes but the inputs' binary_data_size add up to "
                           f"{offset}")
    if cut is not None:
        cut.check_all_claimed()
    outputs, flags = _decode_outputs(doc.get("outputs"))
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidInput("request \"parameters\" must be a JSON object")
    return DecodedRequest(inputs, outputs, _request_id(doc), params, _int_param(params, "priority"),
                          _int_param(params, "timeout"), flags, bool(params.get("binary_data_output", False)))


def _request_id(doc: Mapping[str, Any]) -> str:
    value = doc.get("id", "")
    if not isinstance(value, str):
        raise InvalidInput(f"request \"id\" must be a string, found {type(value).__name__}")
    return value


def _int_param(params: Mapping[str, Any], key: str) -> int:
    value = params.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"request parameter {key!r} must be a non-negative integer, found {value!r}")
    return value


def _tensor_meta(entry: Any, max_elements: int) -> tuple[str, str, np.dtype[Any], tuple[int, ...], int]:
    """(name, datatype, numpy dtype, shape, element count) of a tensor entry, from its metadata alone."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise InvalidInput("each input must be an object with a string \"name\"")
    name: str = entry["name"]
    shape = shape_of(entry, name)
    datatype = entry.get("datatype")
    if not isinstance(datatype, str):
        raise InvalidInput(f"input {name!r}: \"datatype\" must be a string such as \"FP32\"")
    dtype = KSERVE_TO_NUMPY.get(datatype)
    if dtype is None:
        dtype = numpy_for(datatype, name)  # raises, naming the tensor and the known datatypes
    return name, datatype, dtype, shape, element_count(name, shape, max_elements)


def _decode_input(entry: Any, binary: memoryview, offset: int, max_elements: int,
                  cut: CutArrays | None = None, shm: ShmReader | None = None) -> tuple[str, Array, int]:
    name, datatype, dtype, shape, count = _tensor_meta(entry, max_elements)
    params = entry.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidInput(f"input {name!r}: \"parameters\" must be an object")
    reference = shm_reference(params, name, "input") if params else None
    if reference is not None:
        return name, _from_shared_memory(name, reference, shm, dtype, shape, count, params), 0
    size = params.get("binary_data_size")
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise InvalidInput(f"input {name!r}: binary_data_size must be a non-negative integer")
        if offset + size > len(binary):
            raise InvalidInput(f"input {name!r}: binary_data_size {size} goes past the end of the body "
                               f"({len(binary) - offset} bytes left)")
        chunk = binary[offset:offset + size]
        return name, _from_binary(name, chunk, dtype, shape, count), size
    if "data" not in entry:
        raise InvalidInput(f"input {name!r} has neither \"data\" nor parameters.binary_data_size")
    data = entry["data"]
    text = cut.claim(data) if cut is not None else None
    if text is not None and dtype.kind != "O":
        array = parse_pieces(name, text, dtype, count,
                             lambda values, first, booleans: _from_json(name, values, dtype, datatype,
                                                                        (len(values),), len(values), booleans, first))
        return name, array.reshape(shape), 0
    if text is not None:  # numbers for a BYTES input: refused below, or not JSON
        try:
            data = loads(b"[" + text.tobytes() + b"]")
        except orjson.JSONDecodeError as e:
            raise InvalidInput(f"input {name!r}: \"data\" is not valid JSON: {e}") from None
    return name, _from_json(name, data, dtype, datatype, shape, count), 0


def _from_shared_memory(name: str, reference: ShmReference, shm: ShmReader | None, dtype: np.dtype[Any],
                        shape: tuple[int, ...], count: int, params: Mapping[str, Any]) -> Array:
    if shm is None:
        raise InvalidInput(f"input {name!r} names shared-memory region {reference.region!r}, but shared memory "
                           "is only available over the socket API (HTTP and gRPC)")
    if "binary_data_size" in params:
        raise InvalidInput(f"input {name!r}: shared_memory_region and binary_data_size cannot both be given")
    if dtype.kind != "O" and reference.byte_size != count * dtype.itemsize:
        raise InvalidInput(f"input {name!r}: shared_memory_byte_size is {reference.byte_size} bytes, expected "
                           f"{count * dtype.itemsize} for shape {list(shape)} of {dtype.name}")
    return _from_binary(name, shm(reference), dtype, shape, count)


def tensor_from_bytes(name: str, chunk: memoryview, dtype: np.dtype[Any], shape: tuple[int, ...]) -> Array:
    """A tensor from its binary-data bytes (a view where it can be), for front ends that carry raw tensors
    outside this codec's bodies (gRPC's raw_input_contents, a shared-memory region)."""
    count = 1
    for dim in shape:
        count *= dim
    return _from_binary(name, chunk, dtype, shape, count)


def _from_binary(name: str, chunk: memoryview, dtype: np.dtype[Any], shape: tuple[int, ...],
                 count: int) -> Array:
    if dtype.kind == "O":
        return _bytes_elements(name, chunk, count).reshape(shape)
    expected = count * dtype.itemsize
    if len(chunk) != expected:
        raise InvalidInput(f"input {name!r}: binary_data_size is {len(chunk)} bytes, expected {expected} for "
                           f"shape {list(shape)} of {dtype.name}")
    wire = _WIRE_DTYPES.get(dtype)
    array: Array = np.frombuffer(chunk, dtype=dtype.newbyteorder("<") if wire is None else wire).reshape(shape)
    return array


def _bytes_elements(name: str, chunk: memoryview, count: int) -> Array:
    raw = bytes(chunk)
    items = _equal_length_elements(raw, count) if count >= _VECTOR_MIN else None
    if items is None:
        items = _chained_elements(name, raw)
    if len(items) != count:
        raise InvalidInput(f"input {name!r}: found {len(items)} BYTES elements, expected {count} for its shape")
    array = np.empty(count, dtype=object)
    for start in range(0, count, _PIECE):  # in pieces: one long C call would hold the GIL all along
        array[start:start + _PIECE] = items[start:start + _PIECE]
    return array


def _equal_length_elements(raw: bytes, count: int) -> list[bytes] | None:
    """The elements when all ``count`` have the first one's length (fixed-width ids, hashes, padded text), read
    by numpy in one pass; None otherwise (then the elements are walked one by one)."""
    if len(raw) < 4 or len(raw) % count:
        return None
    (width,) = _LENGTH.unpack_from(raw, 0)
    if len(raw) != count * (4 + width):
        return None
    if width == 0:
        return [b""] * count if not any(raw) else None
    records = np.frombuffer(raw, dtype=np.dtype([("length", "<u4"), ("data", f"V{width}")]))
    if not bool((records["length"] == width).all()):
        return None
    data = records["data"]
    items: list[bytes] = []
    for start in range(0, count, _PIECE):
        items += data[start:start + _PIECE].tolist()  # void items come out as bytes, NULs kept
    return items


def _chained_elements(name: str, raw: bytes) -> list[bytes]:
    """Each element's length prefix gives where the next one starts: a walk, one element a step."""
    items: list[bytes] = []
    append, unpack, end = items.append, _LENGTH.unpack_from, len(raw)
    position = 0
    while position < end:
        if position + 4 > end:
            raise InvalidInput(f"input {name!r}: truncated BYTES element length at byte {position}")
        start = position + 4
        position = start + unpack(raw, position)[0]
        if position > end:
            raise InvalidInput(f"input {name!r}: BYTES element of {position - start} bytes runs past the data")
        append(raw[start:position])
    return items


def _from_json(name: str, data: Any, dtype: np.dtype[Any], datatype: str, shape: tuple[int, ...],
               count: int, booleans: bool | None = None, first_index: int = 0) -> Array:
    if not isinstance(data, list):
        data = [data]
    try:
        array = np.asarray(data, dtype=object if dtype.kind == "O" else None)
    except ValueError:
        raise InvalidInput(f"input {name!r} ({datatype}): \"data\" is not a regular (rectangular) list of "
                           "values") from None
    if array.size != count:
        raise InvalidInput(f"input {name!r}: {array.size} values for shape {list(shape)} ({count} elements)")

    def values() -> list[Any]:
        flat: list[Any] = data if array.ndim <= 1 else np.asarray(data, dtype=object).ravel().tolist()
        return flat

    if dtype.kind == "O":
        return bytes_from_json(name, datatype, values()).reshape(shape)
    return numbers_from_json(name, datatype, dtype, array, values, booleans, first_index).reshape(shape)


def _decode_outputs(raw: Any) -> tuple[tuple[OutputRequest, ...], dict[str, bool]]:
    if raw is None:
        return (), {}
    if not isinstance(raw, list):
        raise InvalidInput("request \"outputs\" must be a list")
    outputs = []
    flags: dict[str, bool] = {}
    for entry in raw:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise InvalidInput("each requested output must be an object with a string \"name\"")
        params = entry.get("parameters") or {}
        if not isinstance(params, dict):
            raise InvalidInput(f"output {entry['name']!r}: \"parameters\" must be an object")
        binary = params.get("binary_data")
        classes = params.get("classification", 0)
        if isinstance(classes, bool) or not isinstance(classes, int) or classes < 0:
            raise InvalidInput(f"output {entry['name']!r}: classification must be a non-negative integer")
        reference = shm_reference(params, entry["name"], "output") if params else None
        if reference is not None and classes:
            raise InvalidInput(f"output {entry['name']!r}: Output can't set both 'shared_memory_region' and "
                               "'classification'")
        # as Triton: a named output is binary only by its own binary_data; binary_data_output is the default
        # of the outputs the request does not name
        flags[entry["name"]] = bool(binary)
        outputs.append(OutputRequest(entry["name"], None if binary is None else bool(binary), classes, reference))
    return tuple(outputs), flags


# --- responses -----------------------------------------------------------------------------------------------
def encode_response(response: ResponseLike, binary_outputs: Mapping[str, bool], binary_default: bool,
                    datatypes: Mapping[str, str] | None = None,
                    placed: frozenset[str] = frozenset()) -> tuple[bytes, int | None]:
    """(body, header length or None when all outputs are JSON). Outputs in ``placed`` were written to shared
    memory: their entries carry name, datatype and shape only, as Triton's do."""
    entries: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for name, array in response.outputs.items():
        datatype = ((datatypes.get(name) if datatypes else None) or _DATATYPE_NAMES.get(array.dtype)
                    or kserve_datatype(array))
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if name in placed:
            pass
        elif binary_outputs.get(name, binary_default):
            kind = array.dtype
            # _to_binary's common case inline: this runs for every output of every binary response
            raw = (array.tobytes() if kind.byteorder in _LITTLE_ENDIAN_ORDERS and kind.kind not in "OSU"
                   else _to_binary(array))
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = _to_json_data(array)
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": response.model, "model_version": response.version, "outputs": entries}
    if response.id:
        doc["id"] = response.id
    if response.parameters:
        doc["parameters"] = response.parameters
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


def tensor_bytes(array: Array) -> bytes:
    """A tensor as the binary-data extension carries it (row-major little-endian; BYTES length-prefixed)."""
    return _to_binary(array)


def _to_binary(array: Array) -> bytes:
    if array.dtype.byteorder in _LITTLE_ENDIAN_ORDERS and array.dtype.kind not in "OSU":
        return array.tobytes()  # row-major bytes whatever the array's memory layout
    if array.dtype.kind in "OSU":
        return _length_prefixed(array)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def _length_prefixed(array: Array) -> bytes:
    """BYTES elements (bytes, or str written as UTF-8), each after its 4-byte little-endian length.

    Past ``_VECTOR_MIN`` elements no Python code runs per element: the elements are joined in one call (str ones
    encoded in one call when all are ASCII, as model outputs mostly are), their lengths read with ``map(len)``,
    and numpy places the prefixes and the data in the output; ``_PIECE`` elements at a time, so that no single
    call holds the GIL for long when this runs off the event loop.
    """
    flat = array.ravel()
    count = flat.size
    if count < _VECTOR_MIN:
        parts = []
        for item in flat.tolist():
            raw = item.encode() if isinstance(item, str) else bytes(item)
            parts.append(_LENGTH.pack(len(raw)))
            parts.append(raw)
        return b"".join(parts)
    if count <= _PIECE:
        return _prefixed_piece(flat.tolist())
    return b"".join([_prefixed_piece(flat[start:start + _PIECE].tolist()) for start in range(0, count, _PIECE)])


def _prefixed_piece(items: list[Any]) -> bytes:
    count = len(items)
    data, lengths = _joined(items)
    if int(lengths.max()) > 0xFFFFFFFF:
        raise InvalidInput(f"a BYTES element of {int(lengths.max())} bytes does not fit its 4-byte length")
    out = np.empty(len(data) + 4 * count, dtype=np.uint8)
    starts = np.arange(0, 4 * count, 4, dtype=np.int64)  # each prefix's offset: 4 per element before it ...
    starts[1:] += np.cumsum(lengths[:-1])  # ... and the data of the elements before it
    prefixes = lengths.astype("<u4").view(np.uint8).reshape(count, 4)
    is_data = np.ones(len(out), dtype=bool)
    for byte in range(4):
        out[byte:][starts] = prefixes[:, byte]
        is_data[byte:][starts] = False
    out[is_data] = np.frombuffer(data, dtype=np.uint8)
    return out.tobytes()


def _joined(items: list[Any]) -> tuple[bytes, Array]:
    """(the elements' bytes joined, each element's byte length) with the old per-element semantics: str as
    UTF-8, anything else through bytes()."""
    count = len(items)
    try:
        text = "".join(items)
    except TypeError:  # not all str
        try:
            data = b"".join(items)
        except TypeError:  # not all bytes-like either
            pass
        else:
            lengths = np.fromiter(map(len, items), dtype=np.int64, count=count)
            if int(lengths.sum()) == len(data):  # a multi-byte memoryview's len is not its byte count
                return data, lengths
    else:
        if text.isascii():  # one byte a character: the str lengths are the byte lengths
            return text.encode("ascii"), np.fromiter(map(len, items), dtype=np.int64, count=count)
    encoded = [item.encode() if isinstance(item, str) else bytes(item) for item in items]
    return b"".join(encoded), np.fromiter(map(len, encoded), dtype=np.int64, count=count)


def _to_json_data(array: Array) -> Any:
    if array.dtype.kind in "OSU":
        items = array.ravel().tolist()
        kinds = set(map(type, items))
        if kinds <= {str}:
            return items
        if kinds <= {bytes}:
            return list(map(bytes.decode, items, repeat("utf-8"), repeat("replace")))
        return [item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item) for item in items]
    if has_nonfinite(array):  # written NaN, Infinity, -Infinity, as Triton writes them (orjson writes null)
        flat = np.ascontiguousarray(array).ravel()
        finite = np.where(np.isfinite(flat), flat, 0).astype(flat.dtype)
        return data_fragment(flat, orjson.dumps(_numbers(finite), option=orjson.OPT_SERIALIZE_NUMPY))
    return _numbers(array)


def _numbers(array: Array) -> Any:
    if array.dtype.kind in "biuf" and array.dtype != np.float16:
        return np.ascontiguousarray(array).ravel()  # orjson serialises numpy natively
    return array.ravel().tolist()


def error_body(message: str) -> bytes:
    return orjson.dumps({"error": message})


# --- client side ---------------------------------------------------------------------------------------------
def encode_request(inputs: Mapping[str, Array], outputs: Sequence[str] = (), binary: bool = True,
                   request_id: str = "", parameters: Mapping[str, Any] | None = None,
                   placed_inputs: Sequence[Mapping[str, Any]] = (),
                   placed_outputs: Mapping[str, Mapping[str, Any]] | None = None) -> tuple[bytes, int | None]:
    """Build an infer request body (binary-data extension unless ``binary`` is False). ``placed_inputs`` are
    input entries without data (their bytes are in shared memory); ``placed_outputs`` maps output names to the
    parameters that place them (``shared_memory_region`` ...)."""
    entries: list[dict[str, Any]] = [dict(entry) for entry in placed_inputs]
    chunks: list[bytes] = []
    for name, array in inputs.items():
        entry: dict[str, Any] = {"name": name, "datatype": kserve_datatype(array), "shape": list(array.shape)}
        if binary:
            raw = _to_binary(array)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = _to_json_data(array)
        entries.append(entry)
    doc: dict[str, Any] = {"inputs": entries}
    if request_id:
        doc["id"] = request_id
    params = dict(parameters or {})
    if binary:
        params["binary_data_output"] = True
    if params:
        doc["parameters"] = params
    requested = [{"name": o, "parameters": {"binary_data": binary}} for o in outputs
                 if o not in (placed_outputs or {})]
    requested += [{"name": o, "parameters": dict(p)} for o, p in (placed_outputs or {}).items()]
    if requested:
        doc["outputs"] = requested
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


def decode_response(body: bytes, header_length: int | None) -> tuple[dict[str, Any], dict[str, Array]]:
    """(the JSON document, outputs as numpy arrays) from an infer response body."""
    header = body if header_length is None else body[:header_length]
    try:
        doc = loads(header)
    except orjson.JSONDecodeError as e:
        raise InvalidInput(f"response is not valid JSON: {e}") from None
    binary = memoryview(body)[header_length:] if header_length is not None else memoryview(b"")
    offset = 0
    outputs: dict[str, Array] = {}
    for entry in doc.get("outputs", []):
        params = entry.get("parameters") if isinstance(entry, dict) else None
        if isinstance(entry, dict) and "data" not in entry and not (
                isinstance(params, dict) and "binary_data_size" in params):
            continue  # written to shared memory: the entry names its shape only
        name, array, used = _decode_input(entry, binary, offset, 1 << 62)
        outputs[name] = array
        offset += used
    return doc, outputs

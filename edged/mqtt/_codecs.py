"""Payload codecs: MQTT payloads to engine requests, engine responses to MQTT payloads.

Codecs: ``json`` (a KServe v2 request document), ``binary`` (KServe's binary-data framing; the JSON header's
length travels in the user property ``Inference-Header-Content-Length``), ``raw`` (one tensor's bytes,
little-endian, row-major; datatype, shape and input name from the user properties ``datatype``, ``shape``
("1,64") and ``input``, else from the model config), ``image`` (see _image.py). With MQTT v5 the content type
picks the codec; otherwise the pipeline's codec (request topics: json) applies.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import orjson

from edged.engine import InferResponse
from edged.errors import PayloadError, PayloadTooLarge
from edged.mqtt._image import decode_image, image_spec
from edged.mqtt._message import Inbound
from edged.protocol import DecodedRequest, decode_request, encode_response, loads_json
from edged.protocol.datatypes import numpy_for
from edged.repository.model_config import ModelConfig

HEADER_LENGTH = "Inference-Header-Content-Length"
REPLY_TO = "reply_to"  # MQTT 3.1.1: the reply topic inside a JSON request
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"
CODECS = ("json", "binary", "raw", "image")
_DIGITS = re.compile(r"[0-9]{1,20}")  # ASCII only: str.isdigit also takes '\u00b2', which int() refuses


def codec_for(message: Inbound, default: str) -> str:
    content = (message.content_type or "").split(";")[0].strip().lower()
    if content in (JSON_TYPE, "text/json"):
        return "json"
    if content.startswith("image/"):
        return "image"
    if content == BINARY_TYPE or content.startswith("application/vnd.kserve"):
        return "binary" if message.user_property(HEADER_LENGTH) is not None else "raw"
    return default


def reply_topic_in(message: Inbound) -> str | None:
    """The 3.1.1 reply topic named in a JSON payload's ``reply_to``, if the payload is a JSON object."""
    try:
        doc = loads_json(_json_part(message))  # NaN and ±Infinity as the request's own decoding takes them
    except (orjson.JSONDecodeError, PayloadError):
        return None
    value = doc.get(REPLY_TO) if isinstance(doc, dict) else None
    return value if isinstance(value, str) else None


def _json_part(message: Inbound) -> bytes:
    length = _header_length(message)
    return message.payload if length is None else message.payload[:length]


def _header_length(message: Inbound) -> int | None:
    text = message.user_property(HEADER_LENGTH)
    if text is None:
        return None
    if not _DIGITS.fullmatch(text.strip()):
        raise PayloadError(f"user property {HEADER_LENGTH} must be a number, found {text[:40]!r}")
    return int(text)


def decode(message: Inbound, codec: str, config: ModelConfig, input_name: str | None,
           max_elements: int) -> DecodedRequest:
    if codec == "json":
        return decode_request(message.payload, None, max_elements)
    if codec == "binary":
        length = _header_length(message)
        if length is None:
            raise PayloadError(f"binary payload without the {HEADER_LENGTH} user property")
        return decode_request(message.payload, length, max_elements)
    if codec == "raw":
        return DecodedRequest(dict([_raw_tensor(message, config, input_name, max_elements)]))
    if codec == "image":
        spec = image_spec(config, input_name)
        return DecodedRequest({spec.input: decode_image(message.payload, spec)})
    raise PayloadError(f"unknown codec {codec!r}, expected one of {', '.join(CODECS)}")


def _raw_tensor(message: Inbound, config: ModelConfig, input_name: str | None,
                max_elements: int) -> tuple[str, np.ndarray[Any, Any]]:
    name = message.user_property("input") or input_name
    if name is None:
        if len(config.input) != 1:
            raise PayloadError(f"model {config.name} has {len(config.input)} inputs; name one in the user "
                               "property \"input\"")
        name = config.input[0].name
    tensor = config.input_named(name)
    datatype = message.user_property("datatype") or (tensor.datatype if tensor else "")
    shape = _shape(message.user_property("shape"), config, name)
    dtype = numpy_for(datatype, name)
    if dtype.kind == "O":
        raise PayloadError(f"input {name!r}: raw payloads cannot carry BYTES tensors; use the binary codec")
    count = math.prod(shape)  # Python's integers: int64 would wrap past 2**63
    if count > max_elements:
        raise PayloadTooLarge(f"input {name!r} has {count} elements, more than the limit of {max_elements}")
    if len(message.payload) != count * dtype.itemsize:
        raise PayloadError(f"input {name!r}: payload is {len(message.payload)} bytes, expected "
                           f"{count * dtype.itemsize} for shape {list(shape)} of {datatype}")
    return name, np.frombuffer(message.payload, dtype=dtype.newbyteorder("<")).reshape(shape)


def _shape(text: str | None, config: ModelConfig, name: str) -> tuple[int, ...]:
    if text is not None:
        parts = text.strip().strip("[]").split(",")
        if not all(_DIGITS.fullmatch(p.strip()) for p in parts):
            raise PayloadError(f"input {name!r}: user property shape must be numbers such as \"1,64\", found "
                               f"{text[:60]!r}")
        return tuple(int(p) for p in parts)
    tensor = config.input_named(name)
    if tensor is None or any(d < 0 for d in tensor.dims):
        raise PayloadError(f"input {name!r}: no shape user property and no fixed dims in the model config")
    return ((1,) if config.max_batch_size > 0 else ()) + tuple(tensor.dims)


def encode(response: InferResponse, request: DecodedRequest, parameters: dict[str, Any],
           binary_ok: bool) -> tuple[bytes, int | None]:
    """(body, JSON header length when outputs are binary). Binary outputs only where a user property can carry
    the header length (MQTT v5)."""
    response.parameters = {**response.parameters, **parameters}
    if not binary_ok:
        return encode_response(response, {}, False)
    return encode_response(response, request.binary_outputs, request.binary_default)


def error_payload(message: str, request_id: str = "", parameters: dict[str, Any] | None = None) -> bytes:
    """``{"error": ...}`` with the engine's wording, plus the request id and edged's parameters if known."""
    doc: dict[str, Any] = {"error": message}
    if request_id:
        doc["id"] = request_id
    if parameters:
        doc["parameters"] = parameters
    return orjson.dumps(doc)


def top_k(outputs: dict[str, np.ndarray[Any, Any]], labels: dict[str, list[str]],
          k: int) -> dict[str, np.ndarray[Any, Any]]:
    """Triton's classification format: per row, the k best "score:index[:label]" strings, best first."""
    result: dict[str, np.ndarray[Any, Any]] = {}
    for name, array in outputs.items():
        if array.dtype.kind != "f" or array.ndim == 0:
            result[name] = array
            continue
        rows = array.reshape(-1, array.shape[-1]) if array.ndim > 1 else array.reshape(1, -1)
        count = min(k, rows.shape[1])
        best = np.argsort(-rows, axis=1, kind="stable")[:, :count]
        names = labels.get(name, [])
        table = np.empty((rows.shape[0], count), dtype=object)
        for r, indices in enumerate(best):
            for c, index in enumerate(indices):
                label = f":{names[index]}" if index < len(names) else ""
                table[r, c] = f"{rows[r, index]:.6f}:{index}{label}".encode()
        result[name] = table.reshape((*array.shape[:-1], count)) if array.ndim > 1 else table.reshape(count)
    return result

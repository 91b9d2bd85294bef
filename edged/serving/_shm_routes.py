"""Triton's system shared-memory routes, with its JSON and status codes.

``GET .../status`` lists ``{"name", "key", "offset", "byte_size"}`` objects (one for a named region, 404 when it
is unknown); ``POST .../region/{name}/register`` takes ``{"key", "offset", "byte_size"}``; ``POST
.../unregister`` releases one region or (without a name) every region the caller may use, and succeeds for a
name that is not registered, as Triton does. The CUDA routes exist so that Triton's clients get Triton's
answer for a server without GPUs: an empty status and a refused registration.
"""

from __future__ import annotations

from typing import Any

import orjson

from edged.errors import InvalidInput
from edged.serving._response import Response, error_response, json_response
from edged.serving._routes import Kind, Route
from edged.shm import Caller, SharedMemoryRegistry

_EMPTY_OK = Response(200, b"")
_CUDA_REFUSED = ("failed to register CUDA shared memory region: '{}', GPUs not supported (CUDA IPC does not exist "
                 "on Jetson's integrated GPU; use system shared memory)")


def handle_shm(registry: SharedMemoryRegistry, route: Route, body: bytes | bytearray, peer: Caller) -> Response:
    kind, name = route.kind, route.model
    if kind is Kind.SHM_STATUS:
        return json_response(registry.status(name, peer))
    if kind is Kind.SHM_REGISTER:
        key, offset, byte_size = _register_request(body)
        registry.register(name, key, offset, byte_size, peer)
        return _EMPTY_OK
    if kind is Kind.SHM_UNREGISTER:
        if name:
            registry.unregister(name, peer)
        else:
            registry.unregister_all(peer)
        return _EMPTY_OK
    if kind is Kind.CUDA_SHM_STATUS:
        if name:
            return error_response(404, f"Unable to find cuda shared memory region: '{name}'")
        return json_response([])
    if kind is Kind.CUDA_SHM_REGISTER:
        return error_response(400, _CUDA_REFUSED.format(name))
    return _EMPTY_OK  # CUDA unregister: nothing is ever registered


def _register_request(body: bytes | bytearray) -> tuple[str, int, int]:
    try:
        doc: Any = orjson.loads(body or b"{}")
    except orjson.JSONDecodeError as e:
        raise InvalidInput(f"shared memory register request is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidInput("shared memory register request must be a JSON object with \"key\" and \"byte_size\"")
    key = doc.get("key")
    if not isinstance(key, str):
        raise InvalidInput("Shared memory register request has no 'key' field")
    if "byte_size" not in doc:
        raise InvalidInput("Shared memory register request has no 'byte_size' field")
    return key, _unsigned(doc, "offset", 0), _unsigned(doc, "byte_size", 0)


def _unsigned(doc: dict[str, Any], field: str, default: int) -> int:
    value = doc.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"shared memory register request: '{field}' must be a non-negative integer, found "
                           f"{value!r}")
    return value

"""HTTP responses as bytes, and the one table that maps edged's error families to HTTP status codes.

The status codes follow Triton's HTTP front end: NOT_FOUND → 404, INVALID_ARG → 400, UNAVAILABLE → 503
(Triton reports a request that timed out in the queue as UNAVAILABLE too), INTERNAL → 500. A backend that ran
out of memory answers 503 (OutOfMemory: on a Jetson's shared memory it is usually transient), never 400. A load
that fails because of the model (its config, a corrupt or missing file, a runtime it needs) is a 400, as Triton
answers a failed load (INVALID_ARG, "load failed for model 'm': ..."); a load refused for lack of memory stays
a 503 the caller may retry once something is unloaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from edged.errors import (
    ConfigError,
    EdgedError,
    InferenceFailed,
    InvalidInput,
    MemoryBudgetExceeded,
    MemoryPressure,
    ModelLoadError,
    ModelNotFound,
    ModelNotReady,
    OutOfMemory,
    PayloadTooLarge,
    PermissionDenied,
    QueueFull,
    RequestTimeout,
    SharedMemoryExists,
    SharedMemoryNotFound,
    Unavailable,
    UpdateRejected,
)

REASONS: dict[int, bytes] = {
    100: b"Continue", 200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 403: b"Forbidden", 404: b"Not Found",
    405: b"Method Not Allowed", 408: b"Request Timeout", 409: b"Conflict",
    411: b"Length Required", 413: b"Payload Too Large", 415: b"Unsupported Media Type", 429: b"Too Many Requests",
    431: b"Request Header Fields Too Large", 500: b"Internal Server Error", 501: b"Not Implemented",
    503: b"Service Unavailable", 505: b"HTTP Version Not Supported",
}

JSON = b"application/json"
OCTET = b"application/octet-stream"
PROMETHEUS = b"text/plain; version=0.0.4; charset=utf-8"

# Most specific first: PayloadTooLarge is an InvalidInput, ModelConfigError a ConfigError, MemoryBudgetExceeded and
# MemoryPressure are ModelLoadErrors.
_STATUS_BY_FAMILY: tuple[tuple[type[EdgedError], int], ...] = (
    (PayloadTooLarge, 413),
    (PermissionDenied, 403),
    (ModelNotFound, 404),
    (SharedMemoryNotFound, 404),
    (SharedMemoryExists, 400),  # as Triton answers it over HTTP (gRPC: ALREADY_EXISTS)
    (InvalidInput, 400),
    (ConfigError, 400),
    (UpdateRejected, 409),
    (QueueFull, 503),
    (OutOfMemory, 503),
    # a load the memory budget or the system's memory pressure refuses: retry after unloading something
    (MemoryBudgetExceeded, 503),
    (MemoryPressure, 503),
    (ModelNotReady, 503),
    (Unavailable, 503),
    (RequestTimeout, 503),
    (ModelLoadError, 400),  # after the memory refusals, which are ModelLoadErrors too
)


def status_for(error: BaseException) -> int:
    for family, status in _STATUS_BY_FAMILY:
        if isinstance(error, family):
            return status
    return 500


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: bytes = JSON
    extra_headers: tuple[tuple[bytes, bytes], ...] = ()
    close: bool = False


def json_response(doc: Any, status: int = 200) -> Response:
    return Response(status, orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY))


def error_response(status: int, message: str, close: bool = False) -> Response:
    return Response(status, orjson.dumps({"error": message}), close=close)


# Families the client tells apart although they share a status code (503 above all); sent as X-Edged-Error.
# Most specific first: OutOfMemory is an InferenceFailed.
_NAMED_FAMILIES: tuple[type[EdgedError], ...] = (QueueFull, ModelNotReady, RequestTimeout, Unavailable, OutOfMemory,
                                                 MemoryBudgetExceeded, MemoryPressure, InferenceFailed)


def error_for(error: BaseException) -> Response:
    status = status_for(error)
    family = next((f.__name__ for f in _NAMED_FAMILIES if isinstance(error, f)), None)
    headers = ((b"x-edged-error", family.encode()),) if family else ()
    return Response(status, orjson.dumps({"error": str(error)}), extra_headers=headers)


def render(response: Response, keep_alive: bool) -> bytes:
    """The response's bytes on the wire: status line, headers, body."""
    close = response.close or not keep_alive
    head = [b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n"
            % (response.status, REASONS.get(response.status, b"Unknown"), response.content_type,
               len(response.body))]
    for name, value in response.extra_headers:
        head.append(b"%s: %s\r\n" % (name, value))
    if close:
        head.append(b"connection: close\r\n")
    head.append(b"\r\n")
    head.append(response.body)
    return b"".join(head)

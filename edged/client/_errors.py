"""The client's error family: each HTTP error status from the daemon becomes a typed ``ClientError``.

The classes mirror the server's families (ModelNotFound, InvalidInput, QueueFull, ...) under ``ClientError``;
the daemon's own message is kept verbatim, and ``status`` holds the HTTP status code. Like Triton, the daemon
answers 503 for every "not now" family (not ready, queue full, queue timeout); those are subclasses of
UnavailableError, told apart only when the response names its family in an ``X-Edged-Error`` header.
"""

from __future__ import annotations

from typing import Any

import orjson

from edged.errors import ClientError


class ServerError(ClientError):
    """The daemon answered with an error status; ``str(e)`` is its message."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class UnavailableError(ServerError):
    """503: the server or the model cannot serve this now: shutting down, not ready, queue full or timed out."""


class InvalidInputError(ServerError):
    """400: the request is malformed or does not match the model (server: InvalidInput), or a load failed because
    of the model: its config or its files (server: ModelLoadError, ModelConfigError)."""


class PermissionDeniedError(ServerError):
    """403: the caller may not do this (server: PermissionDenied)."""


class ModelNotFoundError(ServerError):
    """404: the model, version or route does not exist (server: ModelNotFound)."""


class RequestTimeoutError(UnavailableError):
    """408 or 504: the request waited or ran longer than its timeout (server: RequestTimeout)."""


class ModelNotReadyError(UnavailableError):
    """409: the model exists but is not ready (server: ModelNotReady)."""


class PayloadTooLargeError(InvalidInputError):
    """413: a request or tensor exceeds a configured limit (server: PayloadTooLarge)."""


class QueueFullError(UnavailableError):
    """429: the model's queue is full; retry later (server: QueueFull)."""


class InferenceFailedError(ServerError):
    """500: the backend or the server failed (server: InferenceFailed, ...)."""


class OutOfMemoryError(UnavailableError):
    """503: the backend ran out of memory running the request; retry later or smaller (server: OutOfMemory)."""


class MemoryBudgetError(UnavailableError):
    """503: a load was refused by the memory budget or under memory pressure; unload something or raise the
    budget (server: MemoryBudgetExceeded, MemoryPressure)."""


class ClientTimeout(ClientError):
    """No answer arrived within the client's timeout."""


class ProtocolError(ClientError):
    """The daemon's answer is not valid HTTP or not the JSON expected."""


_BY_STATUS: dict[int, type[ServerError]] = {
    400: InvalidInputError, 403: PermissionDeniedError, 404: ModelNotFoundError, 405: InvalidInputError,
    408: RequestTimeoutError, 409: ModelNotReadyError, 413: PayloadTooLargeError, 422: InvalidInputError,
    429: QueueFullError, 500: InferenceFailedError, 503: UnavailableError, 504: RequestTimeoutError,
}


_BY_FAMILY: dict[str, type[ServerError]] = {
    "InvalidInput": InvalidInputError, "PayloadTooLarge": PayloadTooLargeError,
    "PermissionDenied": PermissionDeniedError, "ModelNotFound": ModelNotFoundError,
    "ModelNotReady": ModelNotReadyError, "QueueFull": QueueFullError, "RequestTimeout": RequestTimeoutError,
    "Unavailable": UnavailableError, "InferenceFailed": InferenceFailedError, "OutOfMemory": OutOfMemoryError,
    "MemoryBudgetExceeded": MemoryBudgetError, "MemoryPressure": MemoryBudgetError,
}


def error_for(status: int, body: bytes, what: str, family: str | None = None) -> ServerError:
    """The typed error for an error response; ``family`` is the X-Edged-Error header's value when sent, and
    ``what`` names the call for bodies without a message."""
    cls = _BY_FAMILY.get(family or "") or _BY_STATUS.get(status) or (
        InferenceFailedError if status >= 500 else ServerError)
    return cls(_message(body) or f"{what}: HTTP {status} with no error message", status)


def _message(body: bytes) -> str:
    try:
        doc: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace").strip()
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        return str(doc["error"])
    return body.decode("utf-8", "replace").strip()

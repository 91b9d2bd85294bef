"""The one table that maps edged's error families to gRPC status codes, as Triton's gRPC front end maps its
own: NOT_FOUND, INVALID_ARGUMENT, UNAVAILABLE (a full queue, a model not ready, a request that timed out in the
queue), ALREADY_EXISTS (a region name taken), INTERNAL. Triton has no family for refused access; edged answers
PERMISSION_DENIED, which tritonclient raises like any other error. Messages too large for
``[server] grpc_max_message_mb`` get grpcio's own RESOURCE_EXHAUSTED before any handler runs.
"""

from __future__ import annotations

import grpc

from edged.errors import (
    ConfigError,
    EdgedError,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    PermissionDenied,
    QueueFull,
    RequestTimeout,
    SharedMemoryExists,
    SharedMemoryNotFound,
    Unavailable,
)

# Most specific first: SharedMemoryInvalid and PayloadTooLarge are InvalidInput.
_CODE_BY_FAMILY: tuple[tuple[type[EdgedError], grpc.StatusCode], ...] = (
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (ModelNotFound, grpc.StatusCode.NOT_FOUND),
    (SharedMemoryNotFound, grpc.StatusCode.NOT_FOUND),
    (SharedMemoryExists, grpc.StatusCode.ALREADY_EXISTS),
    (InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
    (ConfigError, grpc.StatusCode.INVALID_ARGUMENT),
    (QueueFull, grpc.StatusCode.UNAVAILABLE),
    (ModelNotReady, grpc.StatusCode.UNAVAILABLE),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (RequestTimeout, grpc.StatusCode.UNAVAILABLE),
)


def code_for(error: EdgedError) -> grpc.StatusCode:
    for family, code in _CODE_BY_FAMILY:
        if isinstance(error, family):
            return code
    return grpc.StatusCode.INTERNAL

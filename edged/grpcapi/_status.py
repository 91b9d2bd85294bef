"""The one table that maps edged's error families to gRPC status codes, as Triton's gRPC front end maps its
own: NOT_FOUND, INVALID_ARGUMENT (also a load that failed because of the model, as Triton answers it),
UNAVAILABLE (a full queue, a model not ready, a request that timed out in the queue, a backend out of memory and a
load refused for lack of memory: HTTP's 503s), ALREADY_EXISTS (a region name taken), CANCELLED (a request
unqueued because its call ended: nobody reads it, but the stream's statistics count it), INTERNAL. Triton has
no family for refused access; edged answers PERMISSION_DENIED, which tritonclient raises like any other error;
a region past edged's shared-memory limits (Triton has none) RESOURCE_EXHAUSTED, gRPC's code for a spent
resource, as is an answer refused because the client's unread answers are past ``[server] grpc_max_unsent_mb``
(``AnswersUnread``). Messages too large for ``[server] grpc_max_message_mb`` get RESOURCE_EXHAUSTED from the call
layer (``_grpc_stream``) before any handler runs. The codes are gRPC's own numbers (doc/statuscodes.md of the
gRPC project).
"""

from __future__ import annotations

from enum import IntEnum

from edged.errors import (
    AnswersUnread,
    ConfigError,
    EdgedError,
    InvalidInput,
    MemoryBudgetExceeded,
    MemoryPressure,
    ModelLoadError,
    ModelNotFound,
    ModelNotReady,
    OutOfMemory,
    PermissionDenied,
    QueueFull,
    RequestCancelled,
    RequestTimeout,
    SharedMemoryExists,
    SharedMemoryLimit,
    SharedMemoryNotFound,
    Unavailable,
)


class Status(IntEnum):
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


# Most specific first: SharedMemoryInvalid and PayloadTooLarge are InvalidInput; MemoryBudgetExceeded and
# MemoryPressure are ModelLoadErrors. The same families as serving/_response.py's 503s are UNAVAILABLE here.
_CODE_BY_FAMILY: tuple[tuple[type[EdgedError], Status], ...] = (
    (PermissionDenied, Status.PERMISSION_DENIED),
    (ModelNotFound, Status.NOT_FOUND),
    (SharedMemoryNotFound, Status.NOT_FOUND),
    (SharedMemoryExists, Status.ALREADY_EXISTS),
    (SharedMemoryLimit, Status.RESOURCE_EXHAUSTED),
    (AnswersUnread, Status.RESOURCE_EXHAUSTED),
    (InvalidInput, Status.INVALID_ARGUMENT),
    (ConfigError, Status.INVALID_ARGUMENT),
    (QueueFull, Status.UNAVAILABLE),
    (ModelNotReady, Status.UNAVAILABLE),
    (Unavailable, Status.UNAVAILABLE),
    (RequestTimeout, Status.UNAVAILABLE),
    (RequestCancelled, Status.CANCELLED),
    (OutOfMemory, Status.UNAVAILABLE),
    (MemoryBudgetExceeded, Status.UNAVAILABLE),
    (MemoryPressure, Status.UNAVAILABLE),
    (ModelLoadError, Status.INVALID_ARGUMENT),
)


def code_for(error: EdgedError) -> Status:
    for family, code in _CODE_BY_FAMILY:
        if isinstance(error, family):
            return code
    return Status.INTERNAL

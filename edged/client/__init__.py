"""Python client of the edged daemon over its Unix socket (KServe v2 + Triton's extensions), sync and asyncio.

Only ``edged.protocol`` and ``edged.errors`` are imported: the client works without the engine or any runtime.
Every error is a ``ClientError``; an HTTP error status becomes the subclass that mirrors the daemon's family.
"""

from edged.client._discovery import SocketSearch, find_sockets, socket_candidates, unreachable_message
from edged.client._errors import (
    ClientTimeout,
    InferenceFailedError,
    InvalidInputError,
    ModelNotFoundError,
    ModelNotReadyError,
    PayloadTooLargeError,
    PermissionDeniedError,
    ProtocolError,
    QueueFullError,
    RequestTimeoutError,
    ServerError,
    UnavailableError,
)
from edged.client._result import InferResult
from edged.client._sync_transport import UnixHTTPConnection
from edged.client.aio import AsyncEdgedClient
from edged.client.shm import SharedMemoryRegion, ShmOutput, ShmTensor, share_with
from edged.client.sync import EdgedClient
from edged.errors import ClientError, ServerUnreachable

__all__ = [
    "AsyncEdgedClient",
    "ClientError",
    "ClientTimeout",
    "EdgedClient",
    "InferResult",
    "InferenceFailedError",
    "InvalidInputError",
    "ModelNotFoundError",
    "ModelNotReadyError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "ProtocolError",
    "QueueFullError",
    "RequestTimeoutError",
    "ServerError",
    "ServerUnreachable",
    "SharedMemoryRegion",
    "ShmOutput",
    "ShmTensor",
    "SocketSearch",
    "UnavailableError",
    "UnixHTTPConnection",
    "find_sockets",
    "share_with",
    "socket_candidates",
    "unreachable_message",
]

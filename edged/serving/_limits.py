"""The server's resource limits: how many connections, how many body bytes in flight, how big one model's body.

Past ``max_connections`` a new connection is accepted, answered ``503`` with ``Retry-After`` and
``connection: close``, and closed, as uvicorn's ``limit_concurrency`` does; the alternative, to stop
accepting, leaves well-behaved clients hanging in the listen backlog (or refused with EAGAIN on a Unix socket)
with no reason given, while a flood that keeps the backlog full decides who gets in. Accepting costs one
descriptor per refused connection for as long as its answer takes, so the effective limit is clamped to
what RLIMIT_NOFILE leaves after the descriptors open at start, ``fd_reserve`` for the daemon's own files
(SQLite, sysfs, model files), one listen backlog of refused connections lingering at once (past it the
oldest is closed) and one more backlog for a burst accepted in one loop iteration before any of them is
seen: a flood never takes the descriptors the telemetry sampler or a model load need. With gRPC configured
(``grpc_port`` or ``grpc_socket``) its front end has the same limit, counted apart, and the same two backlogs
(it closes refused connections past one lingering backlog as HTTP does): the descriptors left are shared
between the two front ends, each getting the effective limit, which the daemon hands to ``GrpcServer.start``.

The in-flight body budget bounds the memory all requests' bodies hold together, from their first byte (or
their Content-Length, reserved before the body is read) until their response; a request that would pass it
gets ``503`` with ``Retry-After`` and is not read.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import resource
import struct
import termios
from dataclasses import dataclass

from edged.config import ServerConfig
from edged.errors import ConfigError
from edged.repository.model_config import ModelConfig
from edged.serving._response import Response, error_response, render

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1
OFFLOAD_BYTES = 1024 * 1024  # infer bodies this large are decoded in the executor, off the event loop
# responses with a BYTES or JSON output of this many elements are encoded there too (a few ms of encoding)
OFFLOAD_ELEMENTS = 16 * 1024
RETRY = ((b"retry-after", str(RETRY_AFTER_S).encode()),)
# The most JSON text one element may take in a request the server reads: "-1.2345678901234567e-308, " is 26.
JSON_BYTES_PER_ELEMENT = 32
# Room for the JSON around the tensors' data (names, shapes, parameters, outputs) in a model's body bound.
HEADER_ALLOWANCE = 64 * 1024
_ITEM_BYTES = {"TYPE_BOOL": 1, "TYPE_UINT8": 1, "TYPE_INT8": 1, "TYPE_UINT16": 2, "TYPE_INT16": 2,
               "TYPE_FP16": 2, "TYPE_BF16": 2, "TYPE_UINT32": 4, "TYPE_INT32": 4, "TYPE_FP32": 4,
               "TYPE_UINT64": 8, "TYPE_INT64": 8, "TYPE_FP64": 8}


@dataclass(frozen=True)
class ConnectionLimit:
    """How many connections are served; ``requested`` is the config's, ``effective`` what descriptors allow."""

    requested: int
    effective: int
    nofile: int  # RLIMIT_NOFILE's soft limit, after raising it towards the hard limit where needed
    open_at_start: int
    reserve: int
    lingering: int  # refused connections that may linger at once, past the effective limit (per front end)
    front_ends: int = 1  # 2 with gRPC: each serves up to ``effective`` connections


def connection_limit(config: ServerConfig) -> ConnectionLimit:
    """Raise the soft RLIMIT_NOFILE as far as needed and allowed, then clamp max_connections to it (for each
    front end that takes connections: HTTP, and gRPC when configured)."""
    open_now = _open_descriptors()
    lingering = config.listen_backlog
    headroom = 2 * lingering  # refused connections lingering, plus one accept burst
    front_ends = 2 if config.grpc_port is not None or config.grpc_socket is not None else 1
    needed = open_now + config.fd_reserve + front_ends * (headroom + config.max_connections)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("could not raise RLIMIT_NOFILE from %d to %d: %s", soft, target, e)
    nofile = needed if soft == resource.RLIM_INFINITY else soft
    effective = min(config.max_connections, (nofile - open_now - config.fd_reserve) // front_ends - headroom)
    each = " for each of HTTP and gRPC" if front_ends == 2 else ""
    if effective < 1:
        raise ConfigError(f"server.max_connections: RLIMIT_NOFILE is {nofile} and {open_now} descriptors are "
                          f"open; with server.fd_reserve = {config.fd_reserve} and twice the listen backlog "
                          f"({headroom}){each} no connection is left; raise LimitNOFILE, or lower fd_reserve or "
                          "listen_backlog")
    if effective < config.max_connections:
        log.warning("serving at most %d connections%s, not server.max_connections = %d: RLIMIT_NOFILE is %d "
                    "(raise LimitNOFILE in the unit to allow more)", effective, each, config.max_connections,
                    nofile)
    return ConnectionLimit(config.max_connections, effective, nofile, open_now, config.fd_reserve, lingering,
                           front_ends)


def _open_descriptors() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 64  # no /proc: assume a daemon's usual start-up set


def model_body_bound(config: ModelConfig) -> int | None:
    """The largest infer body the model's inputs can need (JSON or binary); None when its dims are open.

    Every input at its largest (max_batch_size times its dims) at the larger of its binary size and
    ``JSON_BYTES_PER_ELEMENT``, plus ``HEADER_ALLOWANCE``. Dynamic dims (-1) and strings have no bound.
    """
    total = HEADER_ALLOWANCE
    batch = max(1, config.max_batch_size)
    for tensor in config.input:
        item = _ITEM_BYTES.get(tensor.data_type)
        if item is None or any(dim < 0 for dim in tensor.dims):
            return None
        elements = batch
        for dim in tensor.dims:
            elements *= dim
        total += elements * max(item, JSON_BYTES_PER_ELEMENT)
    return total


def over_limit_response(limit: int) -> bytes:
    body = error_response(503, f"the server is at its limit of {limit} connections (server.max_connections); "
                               f"retry in {RETRY_AFTER_S} s").body
    return render(Response(503, body, extra_headers=RETRY, close=True), keep_alive=False)


def unread_bytes(transport: asyncio.BaseTransport) -> int:
    """Bytes the client sent that wait in the kernel's receive buffer (FIONREAD); 0 when unknown."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return 0
    count: int = struct.unpack("i", raw)[0]
    return count

"""`GrpcServer`: Triton's ``inference.GRPCInferenceService`` (KServe v2 gRPC) on the daemon's event loop.

edged serves gRPC itself: HTTP/2 with prior knowledge (``_h2_connection``), the gRPC call layer
(``_grpc_stream``) and the handlers below, all on the daemon's loop with no thread or completion queue of a
library in between (grpcio's server cost twice the CPU of the HTTP/1.1 path per call: docs/benchmarks.md).
Handlers are found by method name in ``RPCS``; TraceSetting and LogSettings are not there, so they answer
UNIMPLEMENTED as an RPC edged does not serve should. The engine and the shared-memory registry are the HTTP
server's own (the daemon passes both), never a second backend. A unary ModelInfer runs with no task: decoded
when its last DATA frame arrives, submitted, and answered from the engine's callback in one write.

Listeners and access control:
- ``[server] grpc_port``: loopback TCP on ``grpc_host`` (a non-loopback host only with
  ``http_allow_non_loopback``, the HTTP listener's opt-in).
- ``[server] grpc_socket``: a Unix socket edged creates itself, bound under a 0o177 umask, then given
  ``socket_mode`` and ``socket_group``; it is absent while the daemon restarts. Peer credentials are not
  consulted: the socket's mode and group decide who may connect, and every gRPC call, on either listener, is
  judged as a loopback TCP request is, by ``[server.tcp_restricted]`` with gRPC metadata keys instead of
  headers. By default that refuses model loading and unloading, every shared-memory call, and inference where
  ``[server.access]`` limits it to listed users.
- Messages up to ``grpc_max_message_mb`` (a 6.2 MB 1080p frame fits the default); a larger one gets
  RESOURCE_EXHAUSTED from its length prefix, before its bytes are read.
- Request messages being received are charged to the in-flight body budget the daemon shares with the HTTP
  server (``[server] max_inflight_body_bytes``, one budget for both front ends); past it a call gets
  RESOURCE_EXHAUSTED. A message whose bytes stop arriving meets ``request_timeout_s`` (DEADLINE_EXCEEDED), a
  connection with no stream and no frame meets ``idle_timeout_s`` (GOAWAY, then closed).
- A ModelStreamInfer takes at most 64 requests in flight, by back-pressure (``_stream_infer``).
- At most ``[server] max_connections`` gRPC connections (counted apart from HTTP's): one more is answered
  GOAWAY (ENHANCE_YOUR_CALM) and closed.
- Stopping sends GOAWAY on every connection, lets calls in flight finish within the timeout, then closes.
- ``prometheus_lines`` renders the ``edged_grpc_*`` families (``_metrics``); the daemon adds them to ``/metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edged.access import BIND_UMASK, BodyBudget, TcpRestrictions, is_loopback, remove_stale, set_mode_and_group
from edged.config import ServerConfig
from edged.engine import InferenceService
from edged.errors import ConfigError, EdgedError
from edged.grpcapi import _hpack as hpack
from edged.grpcapi._grpc_stream import CallLimits, GrpcCall, RequestHeads, open_call
from edged.grpcapi._h2_connection import H2Connection
from edged.grpcapi._infer import GrpcInfer
from edged.grpcapi._metrics import UNKNOWN, GrpcMetrics
from edged.grpcapi._service import Service
from edged.grpcapi._status import Status, code_for
from edged.grpcapi._stream_infer import STREAM_IN_FLIGHT, StreamCall, StreamStats, parse
from edged.grpcapi.proto import grpc_service_pb2 as pb
from edged.shm import SharedMemoryRegistry

log = logging.getLogger(__name__)

SERVICE_NAME = "inference.GRPCInferenceService"
_PREFIX = f"/{SERVICE_NAME}/".encode()
_ACTIONS = {"RepositoryModelLoad": "load models", "RepositoryModelUnload": "unload models",
            "ModelInfer": "run inference", "ModelStreamInfer": "run inference"}


@dataclass(frozen=True)
class Rpc:
    request: Any  # the generated message class
    category: str  # Triton's API category, which [server.tcp_restricted] keys name
    permission: str  # "open", "infer" or "admin", as the HTTP routes' (edged.serving._routes.SPECS)


RPCS: dict[str, Rpc] = {
    "ServerLive": Rpc(pb.ServerLiveRequest, "health", "open"),
    "ServerReady": Rpc(pb.ServerReadyRequest, "health", "open"),
    "ModelReady": Rpc(pb.ModelReadyRequest, "health", "open"),
    "ServerMetadata": Rpc(pb.ServerMetadataRequest, "metadata", "open"),
    "ModelMetadata": Rpc(pb.ModelMetadataRequest, "metadata", "open"),
    "ModelConfig": Rpc(pb.ModelConfigRequest, "model-config", "open"),
    "ModelStatistics": Rpc(pb.ModelStatisticsRequest, "statistics", "open"),
    "RepositoryIndex": Rpc(pb.RepositoryIndexRequest, "model-repository", "open"),
    "RepositoryModelLoad": Rpc(pb.RepositoryModelLoadRequest, "model-repository", "admin"),
    "RepositoryModelUnload": Rpc(pb.RepositoryModelUnloadRequest, "model-repository", "admin"),
    "SystemSharedMemoryStatus": Rpc(pb.SystemSharedMemoryStatusRequest, "shared-memory", "infer"),
    "SystemSharedMemoryRegister": Rpc(pb.SystemSharedMemoryRegisterRequest, "shared-memory", "infer"),
    "SystemSharedMemoryUnregister": Rpc(pb.SystemSharedMemoryUnregisterRequest, "shared-memory", "infer"),
    "CudaSharedMemoryStatus": Rpc(pb.CudaSharedMemoryStatusRequest, "shared-memory", "infer"),
    "CudaSharedMemoryRegister": Rpc(pb.CudaSharedMemoryRegisterRequest, "shared-memory", "infer"),
    "CudaSharedMemoryUnregister": Rpc(pb.CudaSharedMemoryUnregisterRequest, "shared-memory", "infer"),
    "ModelInfer": Rpc(pb.ModelInferRequest, "inference", "infer"),
    "ModelStreamInfer": Rpc(pb.ModelInferRequest, "inference", "infer"),
}
_BLOCKING = frozenset({"RepositoryModelLoad", "RepositoryModelUnload"})
# RPCs that load a lazily loaded model ([models] load = "lazy") on first use, as the HTTP routes do
_LAZY = frozenset({"ModelMetadata", "ModelConfig"})


_MB = 1024 * 1024


class GrpcServer:
    def __init__(self, service: InferenceService, config: ServerConfig, shared_memory: SharedMemoryRegistry) -> None:
        self._service = service
        self._config = config
        self._shm = shared_memory
        access = config.access
        self._restrictions = TcpRestrictions(config.tcp_restricted,
                                             infer_open=not access.infer_users and not access.infer_groups,
                                             listener="gRPC (TCP or its Unix socket)",
                                             elsewhere="or use the HTTP API on edged's Unix socket")
        self._calls = Service(service, shared_memory)
        self._table: dict[str, Callable[[Any], Any]] = self._unary_table()
        self._limits = CallLimits(config.grpc_max_message_mb * _MB, BodyBudget(config.max_inflight_body_bytes),
                                  config.request_timeout_s)
        self._heads = RequestHeads()  # request headers parsed once per distinct list (access is judged per call)
        self._sweeper: asyncio.Task[None] | None = None
        self._streams = StreamStats()
        self._metrics = GrpcMetrics(RPCS)
        self._infer: GrpcInfer | None = None
        self._servers: list[asyncio.Server] = []
        self._connections: set[H2Connection] = set()
        self._socket: tuple[Path, int] | None = None  # the socket file this process bound, and its inode
        self.addresses: list[str] = []

    @property
    def configured(self) -> bool:
        return self._config.grpc_port is not None or self._config.grpc_socket is not None

    @property
    def body_budget(self) -> BodyBudget:
        return self._limits.budget

    def status(self) -> dict[str, Any]:
        """For the daemon's status document: listeners, connections and the stream bound with its high mark."""
        return {"listeners": list(self.addresses), "connections": len(self._connections),
                "stream_in_flight_limit": STREAM_IN_FLIGHT, "stream_in_flight_peak": self._streams.peak}

    def prometheus_lines(self) -> str:
        """The ``edged_grpc_*`` families, for the daemon to add to ``/metrics`` (front ends never import each other)."""
        return self._metrics.render(len(self._connections))

    async def start(self, body_budget: BodyBudget | None = None) -> None:
        """Listen; ``body_budget`` is the HTTP server's, for one in-flight limit across both front ends."""
        config = self._config
        loop = asyncio.get_running_loop()
        if body_budget is not None:
            self._limits = CallLimits(self._limits.message_bytes, body_budget, config.request_timeout_s)
        self._infer = GrpcInfer(self._service, self._shm, config.max_tensor_elements)
        hpack.warm_up()  # before listening: the first request would pay for the Huffman table
        sockets: list[socket.socket] = []
        try:
            if config.grpc_port is not None:
                sockets.append(self._tcp_socket(config))
            if config.grpc_socket is not None:
                sockets.append(self._unix_socket(Path(config.grpc_socket)))
        except ConfigError:
            for sock in sockets:
                sock.close()
            raise
        for sock in sockets:
            if sock.family == socket.AF_UNIX:
                self._servers.append(await loop.create_unix_server(self._connection, sock=sock))
                self.addresses.append(f"unix:{config.grpc_socket}")
            else:
                self._servers.append(await loop.create_server(self._connection, sock=sock))
                self.addresses.append(f"{config.grpc_host}:{sock.getsockname()[1]}")
        self._sweeper = loop.create_task(self._sweep())
        log.info("serving KServe v2 gRPC on %s", ", ".join(self.addresses))

    async def stop(self, timeout_s: float) -> None:
        """Refuse new calls, let those in flight finish within ``timeout_s``, then remove the socket file."""
        self._calls.draining = True
        loop = asyncio.get_running_loop()
        for server in self._servers:
            server.close()
        for conn in list(self._connections):
            conn.go_away()
        deadline = loop.time() + timeout_s
        while self._connections and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self._connections):
            conn.abort()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        self._servers.clear()
        if self._socket is not None:
            path, inode = self._socket
            with contextlib.suppress(FileNotFoundError):
                if path.lstat().st_ino == inode:  # unless another process has replaced it since
                    path.unlink()
            self._socket = None

    async def _sweep(self) -> None:
        """Idle connections and stalled messages, checked a few times per timeout on the loop's clock."""
        config = self._config
        interval = config.sweep_interval_s
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            now = loop.time()
            for conn in list(self._connections):
                try:
                    conn.sweep(now, config.idle_timeout_s)
                except Exception:  # one connection's bug must not stop the sweeping of the others
                    log.exception("unexpected error sweeping a gRPC connection")

    # --- listeners ------------------------------------------------------------------------------------------
    @staticmethod
    def _tcp_socket(config: ServerConfig) -> socket.socket:
        host = config.grpc_host
        if not config.http_allow_non_loopback and not is_loopback(host):
            raise ConfigError(f"server.grpc_host {host!r} is not a loopback address; it listens on loopback only "
                              "unless server.http_allow_non_loopback = true")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            return socket.create_server((host, config.grpc_port or 0), family=family)
        except OSError as e:
            raise ConfigError(f"cannot listen for gRPC on {host}:{config.grpc_port}: {e.strerror}") from e

    def _unix_socket(self, path: Path) -> socket.socket:
        remove_stale(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        previous = os.umask(BIND_UMASK)  # the file is created by bind: never world-writable, even briefly
        try:
            sock.bind(str(path))
        except OSError as e:
            sock.close()
            raise ConfigError(f"cannot listen for gRPC on Unix socket {path}: {e.strerror}") from e
        finally:
            os.umask(previous)
        try:
            set_mode_and_group(path, self._config.socket_mode, self._config.socket_group)
        except OSError as e:
            sock.close()
            raise ConfigError(f"cannot set the mode or group of gRPC socket {path}: {e.strerror}") from e
        self._socket = (path, path.lstat().st_ino)
        return sock

    def _connection(self) -> H2Connection:
        refuse = len(self._connections) >= self._config.max_connections
        if refuse:
            self._metrics.connections_refused += 1
        conn = H2Connection(self._open, self._connections.discard, self._metrics.h2, refuse=refuse)
        self._connections.add(conn)
        return conn

    # --- dispatch -------------------------------------------------------------------------------------------
    def _unary_table(self) -> dict[str, Callable[[Any], Any]]:
        calls = self._calls
        return {
            "ServerLive": calls.server_live, "ServerReady": calls.server_ready, "ModelReady": calls.model_ready,
            "ServerMetadata": calls.server_metadata, "ModelMetadata": calls.model_metadata,
            "ModelConfig": calls.model_config, "ModelStatistics": calls.model_statistics,
            "RepositoryIndex": calls.repository_index, "RepositoryModelLoad": calls.load,
            "RepositoryModelUnload": calls.unload, "SystemSharedMemoryStatus": calls.shm_status,
            "SystemSharedMemoryRegister": calls.shm_register, "SystemSharedMemoryUnregister": calls.shm_unregister,
            "CudaSharedMemoryStatus": calls.cuda_status, "CudaSharedMemoryRegister": calls.cuda_register,
            "CudaSharedMemoryUnregister": calls.cuda_unregister,
        }

    def _open(self, conn: H2Connection, stream_id: int, headers: list[tuple[bytes, bytes]],
              end_stream: bool) -> GrpcCall | None:
        calls = self._metrics.calls
        call = open_call(conn, stream_id, headers, self._limits, calls[UNKNOWN], self._heads)
        if call is None:
            return None
        path = call.request.path
        name = path[len(_PREFIX):].decode("latin-1") if path.startswith(_PREFIX) else ""
        if name not in RPCS:
            call.fail(Status.UNIMPLEMENTED, f"method {path.decode('latin-1')!r} is not served by edged")
            return call
        call.tally = calls[name]
        try:
            self._admit(name, call.request.metadata)
        except EdgedError as e:
            call.fail(code_for(e), str(e))
            return call
        if name == "ModelStreamInfer":
            if self._infer is None:
                raise RuntimeError("GrpcServer.start() has not run")
            StreamCall(call, self._infer, self._streams)
        else:
            _expect_one(call, self._start_infer if name == "ModelInfer" else self._unary_starter(name))
        if end_stream:
            call.data(memoryview(b""), True)
        return call

    def _admit(self, name: str, metadata: dict[bytes, bytes]) -> None:
        """Raise PermissionDenied unless the call's category and metadata admit it; refuse while draining."""
        rpc = RPCS[name]
        try:
            self._restrictions.check(rpc.category, rpc.permission, metadata, _ACTIONS.get(name, name))
        except EdgedError as e:
            log.warning("gRPC %s refused: %s", name, e)
            raise

    def _start_infer(self, call: GrpcCall, data: bytes) -> None:
        infer = self._infer
        if infer is None:
            raise RuntimeError("GrpcServer.start() has not run")
        decoded = infer.decode(data)  # InvalidInput: answered INVALID_ARGUMENT by _expect_one
        if infer.needs_load(decoded):
            call.task = asyncio.get_running_loop().create_task(self._run(call, infer.infer, decoded))
        else:
            infer.begin(decoded, call.answer)

    def _unary_starter(self, name: str) -> Callable[[GrpcCall, bytes], None]:
        function = self._table[name]
        service = self._service

        async def slow(request: Any) -> Any:
            if name in _LAZY and service.needs_load(request.name):
                await asyncio.get_running_loop().run_in_executor(None, service.ensure_loaded, request.name)
            if name in _BLOCKING:
                return await asyncio.get_running_loop().run_in_executor(None, function, request)
            return function(request)

        def start(call: GrpcCall, data: bytes) -> None:
            request = parse(call, RPCS[name].request, data)
            if request is None:
                return
            if name in _BLOCKING or name in _LAZY:
                call.task = asyncio.get_running_loop().create_task(self._run(call, slow, request))
                return
            try:
                _answer(call, function(request))
            except EdgedError as e:
                call.fail(code_for(e), str(e))

        return start

    @staticmethod
    async def _run(call: GrpcCall, function: Callable[[Any], Any], request: Any) -> None:
        try:
            _answer(call, await function(request))
        except EdgedError as e:
            call.fail(code_for(e), str(e))
        except Exception as e:  # a bug answers INTERNAL, never a hung call
            log.exception("unexpected error in a gRPC call")
            call.fail(Status.INTERNAL, f"internal error: {e}")


def _expect_one(call: GrpcCall, start: Callable[[GrpcCall, bytes], None]) -> None:
    """A unary call: exactly one request message, served once the client has half-closed."""
    messages: list[bytes] = []

    def on_message(data: bytes) -> None:
        if messages:
            call.fail(Status.UNIMPLEMENTED, "more than one request message on a unary call")
        messages.append(data)

    def on_end() -> None:
        if not messages:
            call.fail(Status.UNIMPLEMENTED, "no request message on a unary call")
            return
        try:
            start(call, messages[0])
        except EdgedError as e:
            call.fail(code_for(e), str(e))
        except Exception as e:  # a bug answers this call INTERNAL, never ends the connection's other streams
            log.exception("unexpected error starting a gRPC call")
            call.fail(Status.INTERNAL, f"internal error: {e}")

    call.on_message = on_message
    call.on_end = on_end
    call.expect_whole_request()


def _answer(call: GrpcCall, answer: Any) -> None:
    if isinstance(answer, EdgedError):
        call.fail(code_for(answer), str(answer))
    else:
        call.reply(answer if isinstance(answer, bytes) else answer.SerializeToString())

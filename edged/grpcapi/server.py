"""`GrpcServer`: Triton's ``inference.GRPCInferenceService`` (KServe v2 gRPC) on the daemon's event loop.

Handlers are registered by method name with grpcio's generic handlers and the generated messages'
``FromString``/``SerializeToString``; TraceSetting and LogSettings are not registered, so they answer
UNIMPLEMENTED as an RPC edged does not serve should. The engine and the shared-memory registry are the HTTP
server's own (the daemon passes both), never a second backend.

Listeners and access control:
- ``[server] grpc_port``: loopback TCP on ``grpc_host`` (a non-loopback host only with
  ``http_allow_non_loopback``, the HTTP listener's opt-in).
- ``[server] grpc_socket``: a Unix socket edged creates itself (grpcio cannot adopt a socket-activated
  descriptor), bound under a 0o177 umask, then given ``socket_mode`` and ``socket_group``; it is absent while
  the daemon restarts. grpcio gives a handler no peer credentials on a Unix socket (``context.peer()`` is
  ``unix:PATH``; the auth context names the transport only), so SO_PEERCRED rules cannot apply: the socket's
  mode and group decide who may connect, and every gRPC call, on either listener, is judged as a loopback
  TCP request is, by ``[server.tcp_restricted]`` with gRPC metadata keys instead of headers. By default that
  refuses model loading and unloading, every shared-memory call, and inference where ``[server.access]``
  limits it to listed users.
- Messages up to ``grpc_max_message_mb`` each way (grpcio's default receive limit, 4 MB, is below a 6.2 MB
  1080p frame); larger ones get RESOURCE_EXHAUSTED from grpcio itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from edged.access import BIND_UMASK, TcpRestrictions, is_loopback, remove_stale, set_mode_and_group
from edged.config import ServerConfig
from edged.engine import InferenceService
from edged.errors import ConfigError, EdgedError
from edged.grpcapi._infer import GrpcInfer
from edged.grpcapi._service import Service
from edged.grpcapi._status import code_for
from edged.grpcapi.proto import grpc_service_pb2 as pb
from edged.shm import SharedMemoryRegistry

log = logging.getLogger(__name__)

SERVICE_NAME = "inference.GRPCInferenceService"
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
        self._server: grpc.aio.Server | None = None
        self._socket: tuple[Path, int] | None = None  # the socket file this process bound, and its inode
        self.addresses: list[str] = []

    @property
    def configured(self) -> bool:
        return self._config.grpc_port is not None or self._config.grpc_socket is not None

    async def start(self) -> None:
        config = self._config
        limit = config.grpc_max_message_mb * 1024 * 1024
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit),
                                          ("grpc.max_send_message_length", limit),
                                          ("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers((self._handlers(GrpcInfer(self._service, self._shm,
                                                                  config.max_tensor_elements)),))
        if config.grpc_port is not None:
            self.addresses.append(self._add_tcp(server, config))
        if config.grpc_socket is not None:
            self.addresses.append(self._add_unix(server, Path(config.grpc_socket)))
        await server.start()
        self._server = server
        log.info("serving KServe v2 gRPC on %s", ", ".join(self.addresses))

    async def stop(self, timeout_s: float) -> None:
        """Refuse new calls, let those in flight finish within ``timeout_s``, then remove the socket file."""
        self._calls.draining = True
        if self._server is not None:
            await self._server.stop(timeout_s)
            self._server = None
        if self._socket is not None:
            path, inode = self._socket
            with contextlib.suppress(FileNotFoundError):
                if path.lstat().st_ino == inode:  # unless another process has replaced it since
                    path.unlink()
            self._socket = None

    # --- listeners ------------------------------------------------------------------------------------------
    @staticmethod
    def _add_tcp(server: grpc.aio.Server, config: ServerConfig) -> str:
        host = config.grpc_host
        if not config.http_allow_non_loopback and not is_loopback(host):
            raise ConfigError(f"server.grpc_host {host!r} is not a loopback address; it listens on loopback only "
                              "unless server.http_allow_non_loopback = true")
        target = f"[{host}]:{config.grpc_port}" if ":" in host else f"{host}:{config.grpc_port}"
        try:
            port = server.add_insecure_port(target)
        except RuntimeError as e:
            raise ConfigError(f"cannot listen for gRPC on {target}: {e}") from e
        return f"{host}:{port}"

    def _add_unix(self, server: grpc.aio.Server, path: Path) -> str:
        remove_stale(path)
        previous = os.umask(BIND_UMASK)  # grpcio binds inside add_insecure_port
        try:
            server.add_insecure_port(f"unix:{path}")
        except RuntimeError as e:
            raise ConfigError(f"cannot listen for gRPC on Unix socket {path}: {e}") from e
        finally:
            os.umask(previous)
        try:
            set_mode_and_group(path, self._config.socket_mode, self._config.socket_group)
        except OSError as e:
            raise ConfigError(f"cannot set the mode or group of gRPC socket {path}: {e.strerror}") from e
        self._socket = (path, path.lstat().st_ino)
        return f"unix:{path}"

    # --- dispatch -------------------------------------------------------------------------------------------
    def _handlers(self, infer: GrpcInfer) -> grpc.GenericRpcHandler:
        calls = self._calls
        table: dict[str, Callable[[Any], Any]] = {
            "ServerLive": calls.server_live, "ServerReady": calls.server_ready, "ModelReady": calls.model_ready,
            "ServerMetadata": calls.server_metadata, "ModelMetadata": calls.model_metadata,
            "ModelConfig": calls.model_config, "ModelStatistics": calls.model_statistics,
            "RepositoryIndex": calls.repository_index, "RepositoryModelLoad": calls.load,
            "RepositoryModelUnload": calls.unload, "SystemSharedMemoryStatus": calls.shm_status,
            "SystemSharedMemoryRegister": calls.shm_register, "SystemSharedMemoryUnregister": calls.shm_unregister,
            "CudaSharedMemoryStatus": calls.cuda_status, "CudaSharedMemoryRegister": calls.cuda_register,
            "CudaSharedMemoryUnregister": calls.cuda_unregister,
        }
        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        for name, call in table.items():
            handlers[name] = grpc.unary_unary_rpc_method_handler(
                self._unary(name, call), request_deserializer=RPCS[name].request.FromString,
                response_serializer=_serialize)
        handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
            self._unary_async("ModelInfer", infer.infer), request_deserializer=pb.ModelInferRequest.FromString,
            response_serializer=_serialize)
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
            self._streaming(infer), request_deserializer=pb.ModelInferRequest.FromString,
            response_serializer=_serialize)
        return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)

    def _unary(self, name: str, call: Callable[[Any], Any]) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]],
                                                                         Awaitable[Any]]:
        loop = asyncio.get_running_loop()
        service = self._service

        async def run(request: Any) -> Any:
            if name in _LAZY and service.needs_load(request.name):
                await loop.run_in_executor(None, service.ensure_loaded, request.name)
            if name in _BLOCKING:
                return await loop.run_in_executor(None, call, request)
            return call(request)

        return self._unary_async(name, run)

    def _unary_async(self, name: str, call: Callable[[Any], Awaitable[Any]],
                     ) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]:
        async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            try:
                self._admit(name, context)
                return await call(request)
            except EdgedError as e:
                await context.abort(code_for(e), str(e))
            return None  # not reached: abort raises

        return handle

    def _streaming(self, infer: GrpcInfer) -> Callable[[AsyncIterator[Any], grpc.aio.ServicerContext[Any, Any]],
                                                        AsyncIterator[Any]]:
        async def handle(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any],
                         ) -> AsyncIterator[Any]:
            try:
                self._admit("ModelStreamInfer", context)
            except EdgedError as e:
                await context.abort(code_for(e), str(e))
            async for answer in infer.stream(requests):
                yield answer

        return handle

    def _admit(self, name: str, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """Raise PermissionDenied unless the call's category and metadata admit it; refuse while draining."""
        rpc = RPCS[name]
        metadata = {key.encode("latin-1"): value.encode("latin-1") if isinstance(value, str) else value
                    for key, value in (context.invocation_metadata() or ())}
        try:
            self._restrictions.check(rpc.category, rpc.permission, metadata, _ACTIONS.get(name, name))
        except EdgedError as e:
            log.warning("gRPC %s refused: %s", name, e)
            raise


def _serialize(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return data

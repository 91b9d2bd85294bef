"""`GrpcServer`: Triton's ``inference.GRPCInferenceService`` (KServe v2 gRPC) on the daemon's event loop.

edged serves gRPC itself: HTTP/2 with prior knowledge (``_h2_connection``), the gRPC call layer
(``_grpc_stream``) and the handlers below, all on the daemon's loop with no thread or completion queue of a
library in between (grpcio's server cost twice the CPU of the HTTP/1.1 path per call: docs/benchmarks.md).
Handlers are found by method name in ``RPCS`` (with gRPC's standard health Check, as Triton serves it);
TraceSetting and LogSettings are not there, so they answer UNIMPLEMENTED as an RPC edged does not serve should.
The engine and the shared-memory registry are the HTTP server's own (the daemon passes both), never a second
backend. A unary ModelInfer runs with no task: decoded when its last DATA frame arrives, submitted, and answered
from the engine's callback in one write.

Listeners (``_listeners``) and access control (``_access``):
- ``[server] grpc_port``: loopback TCP on ``grpc_host``; ``[server] grpc_socket``: a Unix socket, adopted
  from systemd (``edged-grpc.socket``, descriptor name ``grpc``) or created by edged.
- On the Unix socket a call is judged as the HTTP Unix socket judges a request: by the peer's credentials
  (SO_PEERCRED, once per connection) and ``[server.access]``, and shared memory is used as that peer (its
  owner and group checks). Over TCP a call is judged by ``[server.tcp_restricted]`` with gRPC metadata keys
  instead of headers; by default that refuses model loading and unloading, every shared-memory call, and
  inference where ``[server.access]`` limits it to listed users.
- Messages up to ``grpc_max_message_mb`` (a 6.2 MB 1080p frame fits the default); a larger one gets
  RESOURCE_EXHAUSTED from its length prefix, before its bytes are read.
- Request messages being received (as their bytes arrive), and a unary call's message until its half-close
  hands it to the engine, are charged to the in-flight body budget the daemon shares with the HTTP server (``[server]
  max_inflight_body_bytes``, one budget for both front ends); past it a call gets RESOURCE_EXHAUSTED. A
  message whose bytes stop arriving meets ``request_timeout_s`` (DEADLINE_EXCEEDED), a connection with no
  stream and no frame meets ``idle_timeout_s`` (GOAWAY, then closed).
- A ModelStreamInfer takes at most 64 requests in flight, by back-pressure (``_stream_infer``).
- A connection must send HTTP/2's client preface and SETTINGS within ``PREFACE_TIMEOUT_S`` (5 s, or
  ``request_timeout_s`` if shorter), else it is closed (``H2Control.sweep``).
- At most ``[server] max_connections`` gRPC connections, of which TCP may take all but an eighth (at least one)
  when a Unix socket is served, so loopback connections never lock out the socket (counted apart from HTTP's;
  under a daemon the limit ``edged.serving`` clamped to RLIMIT_NOFILE, whose budget counts both front ends):
  one more is answered GOAWAY (ENHANCE_YOUR_CALM) and closed; at most ``listen_backlog`` refused connections
  linger for their GOAWAY to be read (past them the oldest is closed at once), and refusals are logged once per
  ``REFUSAL_LOG_S`` with a count.
- Stopping sends GOAWAY on every connection, lets calls in flight finish within the timeout, then closes.
- ``prometheus_lines`` renders the ``edged_grpc_*`` families (``_metrics``); the daemon adds them to ``/metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from edged.access import BodyBudget, Peer
from edged.config import ServerConfig
from edged.engine import InferenceService
from edged.errors import EdgedError
from edged.grpcapi import _hpack as hpack
from edged.grpcapi._access import GrpcAccess
from edged.grpcapi._grpc_stream import CallLimits, GrpcCall, RequestHeads, open_call
from edged.grpcapi._h2_connection import H2Connection
from edged.grpcapi._infer import BYTES_INPUT, BYTES_LOOK, OFFLOAD_BYTES, Gathering, GrpcInfer
from edged.grpcapi._listeners import GrpcListener, open_grpc_listeners
from edged.grpcapi._metrics import UNKNOWN, GrpcMetrics
from edged.grpcapi._service import Service
from edged.grpcapi._status import Status, code_for
from edged.grpcapi._stream_infer import STREAM_IN_FLIGHT, StreamCall, StreamStats, parse
from edged.grpcapi.proto import grpc_service_pb2 as pb
from edged.shm import Caller, SharedMemoryRegistry

log = logging.getLogger(__name__)

SERVICE_NAME = "inference.GRPCInferenceService"
_PREFIX = f"/{SERVICE_NAME}/".encode()
# gRPC's standard health check (grpc.health.v1, what Kubernetes' grpc probes and grpc_health_probe call), which
# Triton serves beside its own health RPCs: its one method, Check, under this name in RPCS and the metrics
HEALTH_CHECK = "grpc.health.v1.Health/Check"
_HEALTH_CHECK_PATH = f"/{HEALTH_CHECK}".encode()
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
    # HealthCheckRequest is {string service = 1}, ModelReadyRequest's first field: read as one, service in .name
    HEALTH_CHECK: Rpc(pb.ModelReadyRequest, "health", "open"),
}
_BLOCKING = frozenset({"RepositoryModelLoad", "RepositoryModelUnload"})
_SHM = frozenset({"SystemSharedMemoryStatus", "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister"})
# RPCs that load a lazily loaded model ([models] load = "lazy") on first use, as the HTTP routes do
_LAZY = frozenset({"ModelMetadata", "ModelConfig"})


_MB = 1024 * 1024
UNIX_RESERVED_SHARE = 8  # an eighth of max_connections (at least one) is kept for the Unix socket
REFUSAL_LOG_S = 10.0  # a flood of refused connections logs one line per interval, with the count


class GrpcServer:
    def __init__(self, service: InferenceService, config: ServerConfig, shared_memory: SharedMemoryRegistry) -> None:
        self._service = service
        self._config = config
        self._shm = shared_memory
        self._access = GrpcAccess(config)
        self._calls = Service(service, shared_memory)
        self._table: dict[str, Callable[..., Any]] = self._unary_table()
        self._limits = CallLimits(config.grpc_max_message_mb * _MB, BodyBudget(config.max_inflight_body_bytes),
                                  config.request_timeout_s)
        self._heads = RequestHeads()  # request headers parsed once per distinct list (access is judged per call)
        self._sweeper: asyncio.Task[None] | None = None
        self._streams = StreamStats()
        self._metrics = GrpcMetrics(RPCS)
        self._infer: GrpcInfer | None = None
        self._tcp_shm: _Peered | None = None  # the TCP path of calls that carry the shared-memory key (start)
        self._gathering = Gathering()  # shared by every inference path (edged.grpcapi._infer)
        self._servers: list[asyncio.Server] = []
        self._connections: set[H2Connection] = set()
        self._max_connections = config.max_connections  # under a daemon, what descriptors allow (start)
        self._lingering = config.listen_backlog
        self._unix_reserved = 0  # slots TCP connections may not take (start: with a Unix socket, an eighth)
        self._refused: dict[H2Connection, None] = {}  # refused, their GOAWAY sent, not closed yet; oldest first
        self._refusals_unlogged = 0
        self._refusal_logged_at = float("-inf")
        # Unix-socket connections, with their inference path once the peer is known (shared memory as the peer)
        # A Unix-socket connection's peer, its own inference path and ModelInfer starter, made on its first
        # stream (None until then); TCP connections are not in it.
        self._peered: dict[H2Connection, _Peered | None] = {}
        self._listeners: list[GrpcListener] = []
        self.addresses: list[str] = []
        self.denied: dict[str, int] = {}  # refusals by action; the HTTP server's own dict under a daemon (start)

    @property
    def configured(self) -> bool:
        return self._config.grpc_port is not None or self._config.grpc_socket is not None

    @property
    def body_budget(self) -> BodyBudget:
        return self._limits.budget

    def status(self) -> dict[str, Any]:
        """For the daemon's status document: listeners (``activated``: those systemd passed), connections and
        the stream bound with its high mark, and how often a stream held its input (``StreamStats``)."""
        return {"listeners": list(self.addresses), "activated": self.inherited,
                "connections": len(self._connections), "max_connections": self._max_connections,
                "connections_refused": self._metrics.connections_refused,
                "stream_in_flight_limit": STREAM_IN_FLIGHT, "stream_in_flight_peak": self._streams.peak,
                "stream_holds": self._streams.holds}

    def prometheus_lines(self) -> str:
        """The ``edged_grpc_*`` families, for the daemon to add to ``/metrics`` (front ends never import each other)."""
        return self._metrics.render(len(self._connections))

    async def start(self, body_budget: BodyBudget | None = None,
                    inherited: list[tuple[str, socket.socket]] | None = None,
                    denied: dict[str, int] | None = None, max_connections: int | None = None,
                    lingering: int | None = None) -> None:
        """Listen; ``body_budget`` is the HTTP server's, for one in-flight limit across both front ends;
        ``inherited`` the sockets systemd passed under the name ``grpc`` (`edged.access.activated_sockets`);
        ``denied`` the HTTP server's refusal counts by action, which gRPC's refusals are added to (one
        ``edged_access_denied_total`` for the daemon); ``max_connections`` and ``lingering`` the HTTP server's
        connection limit, sized in the descriptor budget for both front ends (alone: the config's)."""
        if denied is not None:
            self.denied = denied
        if max_connections is not None:
            self._max_connections = max_connections
        if lingering is not None:
            self._lingering = lingering
        config = self._config
        loop = asyncio.get_running_loop()
        if body_budget is not None:
            self._limits = CallLimits(self._limits.message_bytes, body_budget, config.request_timeout_s)
        # TCP calls share one inference path that may use no shared memory, and one that may, for the calls that
        # carry the [server.tcp_restricted] shared-memory key (when one is configured)
        self._infer = GrpcInfer(self._service, self._shm, config.max_tensor_elements,
                                caller=self._access.refuse_tcp_shm, gathering=self._gathering)
        if self._access.tcp_shm_configured:
            shm_infer = GrpcInfer(self._service, self._shm, config.max_tensor_elements, gathering=self._gathering)
            self._tcp_shm = (None, shm_infer, _bound(self._start_infer, shm_infer))
        hpack.warm_up()  # before listening: the first request would pay for the Huffman table
        self._listeners = open_grpc_listeners(config, inherited or [])
        for listener in self._listeners:
            sock = listener.socket
            if sock.family == socket.AF_UNIX:
                server = await loop.create_unix_server(lambda: self._connection(unix=True), sock=sock)
            else:
                server = await loop.create_server(lambda: self._connection(unix=False), sock=sock)
            self._servers.append(server)
            self.addresses.append(listener.address)
        if any(listener.socket.family == socket.AF_UNIX for listener in self._listeners):
            self._unix_reserved = min(max(1, self._max_connections // UNIX_RESERVED_SHARE), self._max_connections - 1)
        self._sweeper = loop.create_task(self._sweep())
        log.info("serving KServe v2 gRPC on %s", ", ".join(self.addresses))

    @property
    def inherited(self) -> list[str]:
        """The addresses of the listeners systemd passed."""
        return [item.address for item in self._listeners if item.inherited]

    async def stop(self, timeout_s: float) -> None:
        """Refuse new calls, let those in flight finish within ``timeout_s``, then remove the socket file edged
        created (one systemd passed stays, with its unit)."""
        self._calls.draining = True
        loop = asyncio.get_running_loop()
        for server in self._servers:
            server.close()
        for conn in list(self._connections):
            conn.go_away()
        deadline = loop.time() + timeout_s
        while self._connections and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for conn in [*self._connections, *self._refused]:
            conn.abort()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        self._servers.clear()
        for listener in self._listeners:  # an inherited socket's file belongs to its socket unit: it stays
            if listener.created is not None:
                path, inode = listener.created
                with contextlib.suppress(FileNotFoundError):
                    if path.lstat().st_ino == inode:  # unless another process has replaced it since
                        path.unlink()
        self._listeners = []

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
                    conn.sweep(now, config.idle_timeout_s, config.request_timeout_s)
                except Exception:  # one connection's bug must not stop the sweeping of the others
                    log.exception("unexpected error sweeping a gRPC connection")

    # --- connections --------------------------------------------------------------------------------------
    def _connection(self, unix: bool) -> H2Connection:
        # TCP takes at most what leaves the Unix socket its reserved slots: loopback connections, open to any local
        # process, cannot lock out the socket whose file mode and peer credentials say who may connect
        open_now = len(self._connections)
        if unix:
            refuse = open_now >= self._max_connections
        else:
            refuse = open_now - len(self._peered) >= self._max_connections - self._unix_reserved
        conn = H2Connection(self._open, self._closed, self._metrics.h2, refuse=refuse,
                            unsent_limit=self._config.grpc_max_unsent_mb * _MB)
        if refuse:
            self._refuse(conn)
            return conn
        self._connections.add(conn)
        if unix:
            self._peered[conn] = None  # its peer is read on its first stream
        return conn

    def _refuse(self, conn: H2Connection) -> None:
        """Count and log a connection refused past the limit, and keep the lingering ones within their
        descriptors: past ``lingering`` the oldest is closed, which had the longest to read its GOAWAY."""
        self._metrics.connections_refused += 1
        self._refusals_unlogged += 1
        now = asyncio.get_running_loop().time()
        if now - self._refusal_logged_at >= REFUSAL_LOG_S:
            configured = self._config.max_connections
            limit = (f"[server] max_connections = {configured}" if self._max_connections >= configured else
                     f"{self._max_connections}: [server] max_connections = {configured} clamped to what "
                     "RLIMIT_NOFILE leaves")
            log.warning("gRPC connection limit reached: %d connections open (%d on the Unix socket; limit %s, %d of "
                        "them kept for the Unix socket); %d refused with GOAWAY ENHANCE_YOUR_CALM since the last such "
                        "line, %d since start", len(self._connections), len(self._peered), limit, self._unix_reserved,
                        self._refusals_unlogged, self._metrics.connections_refused)
            self._refusal_logged_at = now
            self._refusals_unlogged = 0
        refused = self._refused
        if len(refused) >= self._lingering:
            oldest = next(iter(refused))
            del refused[oldest]
            oldest.abort()
        refused[conn] = None

    def _closed(self, conn: H2Connection) -> None:
        self._connections.discard(conn)
        self._refused.pop(conn, None)
        self._peered.pop(conn, None)

    def _peer(self, conn: H2Connection) -> _Peered:
        """A Unix-socket connection's peer, its own inference path (shared memory used as that peer) and its
        ModelInfer starter, made once per connection."""
        peer = conn.peer_credentials()
        access = self._access
        infer = GrpcInfer(self._service, self._shm, self._config.max_tensor_elements,
                          caller=lambda: access.caller(peer), gathering=self._gathering)
        peered = self._peered[conn] = (peer, infer, _bound(self._start_infer, infer))
        return peered

    # --- dispatch -------------------------------------------------------------------------------------------
    def _unary_table(self) -> dict[str, Callable[..., Any]]:
        calls = self._calls
        return {
            "ServerLive": calls.server_live, "ServerReady": calls.server_ready, "ModelReady": calls.model_ready,
            "ServerMetadata": calls.server_metadata, "ModelMetadata": calls.model_metadata,
            "ModelConfig": calls.model_config, "ModelStatistics": calls.model_statistics,
            "RepositoryIndex": calls.repository_index, "RepositoryModelLoad": calls.load,
            "RepositoryModelUnload": calls.unload, "SystemSharedMemoryStatus": calls.shm_status,
            "SystemSharedMemoryRegister": calls.shm_register, "SystemSharedMemoryUnregister": calls.shm_unregister,
            "CudaSharedMemoryStatus": calls.cuda_status, "CudaSharedMemoryRegister": calls.cuda_register,
            "CudaSharedMemoryUnregister": calls.cuda_unregister, HEALTH_CHECK: calls.health_check,
        }

    def _open(self, conn: H2Connection, stream_id: int, headers: list[tuple[bytes, bytes]],
              end_stream: bool) -> GrpcCall | None:
        calls = self._metrics.calls
        call = open_call(conn, stream_id, headers, self._limits, calls[UNKNOWN], self._heads)
        if call is None:
            return None
        path = call.request.path
        name = (path[len(_PREFIX):].decode("latin-1") if path.startswith(_PREFIX)
                else HEALTH_CHECK if path == _HEALTH_CHECK_PATH else "")
        if name not in RPCS:
            call.fail(Status.UNIMPLEMENTED, f"method {path.decode('latin-1')!r} is not served by edged")
            return call
        call.tally = calls[name]
        if conn.output.unsent >= conn.unsent_limit and (unread := call.unread_answers("a new call")) is not None:
            call.fail(code_for(unread), str(unread))  # the client reads nothing: its new calls would wait too
            return call
        peered = self._peered.get(conn, _TCP)
        if peered is _TCP and self._tcp_shm is not None and self._access.tcp_admits_shm(call.request.metadata):
            peered = self._tcp_shm
        peer, infer, start_infer = peered or self._peer(conn)
        try:
            self._admit(name, call.request.metadata, peer)
        except EdgedError as e:
            call.fail(code_for(e), str(e))
            return call
        if name == "ModelStreamInfer":
            infer = infer or self._infer
            if infer is None:
                raise RuntimeError("GrpcServer.start() has not run")
            StreamCall(call, infer, self._streams)
        elif name == "ModelInfer":
            _expect_one(call, start_infer or self._start_infer)
        else:
            _expect_one(call, self._unary_starter(name, peer))
        if end_stream:
            call.data(memoryview(b""), True)
        return call

    def _admit(self, name: str, metadata: dict[bytes, bytes], peer: Peer | None) -> None:
        """Raise PermissionDenied unless the Unix-socket ``peer`` (None: TCP, judged by ``metadata``) may
        make the call."""
        rpc = RPCS[name]
        action = _ACTIONS.get(name, name)
        try:
            self._access.check(peer, rpc.category, rpc.permission, metadata, action)
        except EdgedError as e:
            self.denied[action] = self.denied.get(action, 0) + 1
            log.warning("gRPC %s refused: %s", name, e)
            raise
        if rpc.permission == "admin":
            log.info("gRPC %s requested by %s", name, self._access.describe(peer))

    def _start_infer(self, call: GrpcCall, data: bytes, infer: GrpcInfer | None = None) -> None:
        infer = infer or self._infer
        if infer is None:
            raise RuntimeError("GrpcServer.start() has not run")
        if len(data) >= OFFLOAD_BYTES and data.find(BYTES_INPUT, 0, BYTES_LOOK) >= 0:
            # a large request that names a BYTES tensor: its elements are read one by one, in the executor
            call.task = asyncio.get_running_loop().create_task(self._run(call, _decode_elsewhere(infer, call), data))
            return
        decoded = infer.decode(data)  # InvalidInput: answered INVALID_ARGUMENT by _expect_one
        decoded.request.cancellation = call.cancellation  # a reset or deadline unqueues it
        if infer.needs_load(decoded):
            call.task = asyncio.get_running_loop().create_task(self._run(call, infer.infer, decoded))
        else:
            infer.begin(decoded, call.answer, call.sender)

    def _unary_starter(self, name: str, peer: Peer | None) -> Callable[[GrpcCall, bytes], None]:
        function = self._table[name]
        if name in _SHM:  # shared memory is used as the caller: its owner and group checks (edged.shm)
            function = _as_caller(function, self._access.caller(peer))
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


# What _open needs of a connection's caller: its peer (None over TCP), its inference path and ModelInfer starter
# (None over TCP: the server's shared ones).
_Peered = tuple["Peer | None", "GrpcInfer | None", "Callable[[GrpcCall, bytes], None] | None"]
_TCP: _Peered = (None, None, None)


def _bound(start: Callable[[GrpcCall, bytes, GrpcInfer], None], infer: GrpcInfer,
           ) -> Callable[[GrpcCall, bytes], None]:
    return lambda call, data: start(call, data, infer)


def _decode_elsewhere(infer: GrpcInfer, call: GrpcCall) -> Callable[[bytes], Awaitable[bytes]]:
    """ModelInfer for a request decoded in the executor (``OFFLOAD_BYTES``), then submitted from the loop."""
    async def run(data: bytes) -> bytes:
        decoded = await asyncio.get_running_loop().run_in_executor(None, infer.decode, data)
        decoded.request.cancellation = call.cancellation
        return await infer.infer(decoded)
    return run


def _as_caller(function: Callable[..., Any], caller: Caller) -> Callable[[Any], Any]:
    return lambda request: function(request, caller)


def _expect_one(call: GrpcCall, start: Callable[[GrpcCall, bytes], None]) -> None:
    """A unary call: exactly one request message, served once the client has half-closed (until then the call
    keeps it charged to the in-flight budget: ``GrpcCall.expect_whole_request``)."""
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

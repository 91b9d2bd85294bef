"""`HttpServer`: the KServe v2 HTTP/1.1 server on the daemon's event loop, over Unix sockets and loopback TCP.

The daemon opens the sockets (`open_listeners`) and owns the loop; the server serves them until `stop`, which
stops accepting, lets requests in flight finish within its timeout and then closes every connection. A
sweeper closes idle keep-alive connections and answers 408 to requests that take too long to arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from edged.access import BodyBudget
from edged.config import ServerConfig
from edged.engine import InferenceService
from edged.errors import ConfigError
from edged.exposition import MetricFamily, render
from edged.serving._access import AccessPolicy
from edged.serving._api_key import api_key_for
from edged.serving._app import App
from edged.serving._handlers import Handlers
from edged.serving._http import Connection
from edged.serving._limits import ConnectionLimit, connection_limit
from edged.serving._openapi import openapi_document
from edged.shm import SharedMemoryRegistry, ShmLimits

log = logging.getLogger(__name__)


def registry_for(config: ServerConfig) -> SharedMemoryRegistry:
    """The shared-memory registry with the limits of ``[server]``."""
    return SharedMemoryRegistry(ShmLimits(config.shm_max_regions, config.shm_max_bytes_mb * 1024 * 1024))


class HttpServer:
    def __init__(self, service: InferenceService, config: ServerConfig, *, telemetry: Any = None,
                 status_provider: Callable[[], dict[str, Any]] | None = None,
                 metrics_provider: Callable[[], str] | None = None,
                 daemon_actions: Mapping[str, Callable[[], Any]] | None = None,
                 shared_memory: SharedMemoryRegistry | None = None) -> None:
        self._service = service
        self._daemon_actions = daemon_actions
        self._metrics_provider = metrics_provider
        self._config = config
        self._telemetry = telemetry
        self._status_provider = status_provider
        # unknown user or group names, malformed tcp_restricted entries fail here, at build time
        self._access = AccessPolicy(config.access, config.tcp_restricted)
        self._api_key = api_key_for(config)  # an unreadable key file fails here too
        # the daemon passes the registry it shares with the gRPC front end, and closes it itself
        self._owns_shared_memory = shared_memory is None
        self.shared_memory = shared_memory if shared_memory is not None else registry_for(config)
        self._app: App | None = None
        self._servers: list[asyncio.AbstractServer] = []
        self._sweeper: asyncio.Task[None] | None = None
        self._addresses: list[str] = []

    @property
    def active_requests(self) -> int:
        return self._app.active if self._app is not None else 0

    @property
    def body_budget(self) -> BodyBudget:
        """The in-flight body budget, which the daemon shares with the gRPC front end (after ``start``)."""
        if self._app is None:
            raise RuntimeError("HttpServer.start() has not run")
        return self._app.body_budget

    @property
    def denied(self) -> dict[str, int]:
        """Refusals by access control, by action (``edged_access_denied_total``); the daemon hands it to the gRPC
        front end, whose refusals it counts too (after ``start``)."""
        if self._app is None:
            raise RuntimeError("HttpServer.start() has not run")
        return self._app.handlers.denied

    @property
    def connection_limit(self) -> ConnectionLimit:
        """The connections each front end serves (``effective``) and lets linger refused, which the daemon hands
        to the gRPC front end: ``connection_limit`` counted both in the descriptors (after ``start``)."""
        if self._app is None:
            raise RuntimeError("HttpServer.start() has not run")
        return self._app.connection_limit

    @property
    def connection_count(self) -> int:
        return len(self._app.connections) if self._app is not None else 0

    async def start(self, sockets: list[socket.socket]) -> None:
        config = self._config
        grpc_tcp = config.grpc_port is not None  # judged by it too; the gRPC Unix socket judges peers instead
        if config.tcp_restricted and not grpc_tcp and all(sock.family == socket.AF_UNIX for sock in sockets):
            raise ConfigError("server.tcp_restricted is set but edged has no TCP listener (server.http_port, "
                              "an activated TCP socket, server.grpc_port): it would restrict nothing, as Unix "
                              "sockets judge callers by their credentials; remove it or add one")
        if self._api_key is not None and all(sock.family == socket.AF_UNIX for sock in sockets):
            raise ConfigError("server.openai_api_key(_file) is set but edged has no TCP listener "
                              "(server.http_port, an activated TCP socket): the key guards only TCP; remove it "
                              "or add one")
        loop = asyncio.get_running_loop()
        handlers = Handlers(self._service, self._telemetry, self._status_provider, openapi_document(),
                            self._metrics_provider)
        handlers.status_extra = self._status_extra
        handlers.metrics_extra = self._metrics_extra
        app = self._app = App(self._service, self._config, self._access, handlers,
                              connection_limit(self._config), self.shared_memory, self._daemon_actions,
                              self._api_key)
        for sock in sockets:
            sock.setblocking(False)
            if sock.family == socket.AF_UNIX:
                server = await loop.create_unix_server(lambda: Connection(app, "uds"), sock=sock)
            else:
                server = await loop.create_server(lambda: Connection(app, "tcp"), sock=sock)
            self._servers.append(server)
            self._addresses.append(str(sock.getsockname()))
        self._sweeper = loop.create_task(self._sweep(), name="edged-http-sweeper")
        log.info("serving the KServe v2 API on %s", ", ".join(self._addresses))

    async def stop(self, timeout_s: float) -> None:
        """Stop accepting, let requests in flight finish within ``timeout_s``, then close every connection."""
        app = self._app
        if app is None:
            return
        app.draining = app.handlers.draining = True
        for server in self._servers:
            server.close()
        deadline = time.monotonic() + timeout_s
        # Until every connection is gone, not only until no request is active: a connection closes with a
        # lingering close, and one whose next request is already buffered is answered (503) before it closes.
        while (app.active or app.connections) and time.monotonic() < deadline:
            for connection in list(app.connections):
                connection.close_idle()
            await asyncio.sleep(0.01)
        if app.active:
            log.warning("%d requests still in flight after %.1f s; closing their connections", app.active,
                        timeout_s)
        for connection in list(app.connections):
            connection.close_now()
        app.infer.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for server in self._servers:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(server.wait_closed(), max(0.1, deadline - time.monotonic()))
        self._servers = []
        if self._owns_shared_memory:
            self.shared_memory.close()  # after the connections: no request can still be reading a region

    async def _sweep(self) -> None:
        config = self._config
        interval = config.sweep_interval_s
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            self.shared_memory.sweep()  # mappings unregistered while a request held them
            app = self._app
            if app is None:
                continue
            now = loop.time()
            for connection in list(app.connections):
                stalled = connection.write_stalled_since
                if stalled and now - stalled > config.request_timeout_s:
                    connection.abandon_unread(config.request_timeout_s)
                elif (connection.request_started and not stalled
                        and now - connection.request_started > config.request_timeout_s):
                    # not while our writes wait for the client: we stopped reading its request, not it sending
                    connection.reject(408, f"the request did not arrive completely within "
                                           f"{config.request_timeout_s} s")
                elif connection.idle and now - connection.last_activity > config.idle_timeout_s:
                    connection.close_idle()

    def _metrics_extra(self) -> str:
        app = self._app
        if app is None:
            return ""
        return render([
            MetricFamily("edged_http_connections", "gauge", "Open connections of the socket API.")
            .add(self.connection_count),
            MetricFamily("edged_http_max_connections", "gauge",
                         "Connections served at most ([server] max_connections, clamped to the descriptors left)")
            .add(app.connection_limit.effective),
            MetricFamily("edged_http_connections_refused_total", "counter",
                         "Connections answered 503 past max_connections.").add(app.refused_connections),
            MetricFamily("edged_http_inflight_body_bytes", "gauge", "Request bodies held at once.")
            .add(app.body_budget.used),
            MetricFamily("edged_http_bodies_refused_total", "counter",
                         "Requests refused because the in-flight body budget was spent.").add(app.body_budget.refused),
            MetricFamily("edged_shm_regions", "gauge", "Registered system shared-memory regions.")
            .add(len(self.shared_memory)),
            MetricFamily("edged_shm_mapped_bytes", "gauge", "Bytes of system shared memory mapped.")
            .add(self.shared_memory.mapped_bytes),
            *app.chat.metric_families(),
        ])

    def _status_extra(self) -> dict[str, Any]:
        app = self._app
        if app is None:
            return {"listeners": list(self._addresses)}
        limit = app.connection_limit
        return {"listeners": list(self._addresses), "connections": self.connection_count,
                "active_requests": self.active_requests,
                "shared_memory": {"regions": len(self.shared_memory), "mapped_bytes": self.shared_memory.mapped_bytes},
                "limits": {"max_connections": limit.effective, "max_connections_configured": limit.requested,
                           "nofile": limit.nofile, "fd_reserve": limit.reserve,
                           "connections_refused": app.refused_connections,
                           "inflight_body_bytes": app.body_budget.used,
                           "inflight_body_limit_bytes": app.body_budget.limit,
                           "bodies_refused": app.body_budget.refused}}

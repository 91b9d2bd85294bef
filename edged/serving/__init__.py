"""The socket API: KServe v2 over HTTP/1.1 on a Unix socket (and loopback TCP), with Triton's extensions.

The daemon opens the listeners and hands their sockets to `HttpServer` on its event loop::

    listeners = open_listeners(config.server, Path(config.server.socket or default_socket_path()))
    server = HttpServer(service, config.server, telemetry=telemetry, status_provider=status)
    await server.start([listener.socket for listener in listeners])
    ...
    await server.stop(config.server.shutdown_timeout_s)
"""

from edged.serving.listeners import Listener, default_socket_path, open_listeners
from edged.serving.server import HttpServer

__all__ = ["HttpServer", "Listener", "default_socket_path", "open_listeners"]

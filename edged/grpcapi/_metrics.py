"""The gRPC front end's Prometheus families, rendered beside the HTTP server's on ``/metrics`` (the daemon
composes them; the serving package never imports this one).

Label sets are bounded: ``method`` is an RPC of ``server.RPCS`` or ``unknown`` (any other path a client
names), ``code`` a ``Status`` name, ``error`` an HTTP/2 ``ErrorCode`` name. Counting is a dict increment where
a call ends (``GrpcCall``) or an error frame is sent (``H2Control``): nothing is formatted until a scrape.
"""

from __future__ import annotations

from collections.abc import Iterable

from edged.exposition import MetricFamily, render
from edged.grpcapi._h2_control import H2Counts
from edged.grpcapi._h2_frames import ErrorCode
from edged.grpcapi._status import Status

UNKNOWN = "unknown"
# the error codes edged's HTTP/2 layer sends, shown at 0 before the first (REFUSED_STREAM has its own family)
_SENT = (ErrorCode.PROTOCOL_ERROR, ErrorCode.FLOW_CONTROL_ERROR, ErrorCode.STREAM_CLOSED, ErrorCode.FRAME_SIZE_ERROR,
         ErrorCode.COMPRESSION_ERROR, ErrorCode.ENHANCE_YOUR_CALM)


class GrpcMetrics:
    """Counters of one ``GrpcServer``: calls ended per method and status, refusals, protocol errors sent."""

    def __init__(self, methods: Iterable[str]) -> None:
        self.h2 = H2Counts()
        self.connections_refused = 0
        self.calls: dict[str, dict[Status, int]] = {name: {} for name in (*methods, UNKNOWN)}

    def render(self, connections: int) -> str:
        calls = MetricFamily("edged_grpc_calls_total", "counter",
                             "gRPC calls ended, by RPC and gRPC status (CANCELLED: reset by the client)")
        for method, tally in sorted(self.calls.items()):
            for code, count in sorted(tally.items()):
                calls.add(count, {"method": method, "code": code.name})
        errors = MetricFamily("edged_grpc_protocol_errors_total", "counter",
                              "HTTP/2 errors edged sent, by code: GOAWAY ends a connection, RST_STREAM a stream")
        for error in sorted({*_SENT, *self.h2.errors}):
            errors.add(self.h2.errors.get(error, 0), {"error": error.name})
        return render([
            MetricFamily("edged_grpc_connections", "gauge", "Open gRPC connections.").add(connections),
            MetricFamily("edged_grpc_connections_refused_total", "counter",
                         "gRPC connections refused past [server] max_connections (GOAWAY ENHANCE_YOUR_CALM)")
            .add(self.connections_refused),
            calls,
            MetricFamily("edged_grpc_streams_refused_total", "counter",
                         "HTTP/2 streams refused (RST_STREAM REFUSED_STREAM): past 128 open, or while going away")
            .add(self.h2.streams_refused),
            errors,
        ])

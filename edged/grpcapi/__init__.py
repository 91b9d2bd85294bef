"""The KServe v2 gRPC front end: Triton's ``GRPCInferenceService`` on the daemon's loop (see ``server``).

Named ``grpcapi`` so that it never shadows the ``grpc`` library. Like the other front ends it knows the engine
and the shared-memory registry, never the HTTP server or MQTT.
"""

from edged.grpcapi.server import RPCS, SERVICE_NAME, GrpcServer

__all__ = ["RPCS", "SERVICE_NAME", "GrpcServer"]

"""The ``[server]`` section: listeners, limits and access control of the socket API."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edged.config._tcp_restricted import check_tcp_restricted
from edged.errors import ConfigError


def _positive(value: float) -> str | None:
    return None if value > 0 else "expected a positive number"


def _octal_mode(value: str) -> str | None:
    try:
        mode = int(value, 8)
    except ValueError:
        return "expected an octal file mode such as \"0660\""
    return None if 0 <= mode <= 0o777 else "expected an octal file mode between 0000 and 0777"


def _port(value: int | None) -> str | None:
    return None if value is None or 0 <= value <= 65535 else "expected a TCP port between 0 and 65535"


def _grpc_message_mb(value: int) -> str | None:
    # below the 4 GiB a gRPC length prefix can name, and within the signed 32-bit sizes gRPC clients take
    return None if 0 < value <= 2047 else "expected a size in MB between 1 and 2047"


def _tcp_restricted(value: dict[str, str]) -> str | None:
    check_tcp_restricted(value)  # raises itself: the loader's own message would quote the secret values
    return None


def _api_key(value: str | None) -> str | None:
    # raises itself: the loader's own message would quote the secret
    if value is not None and (len(value.strip()) < 16 or value != value.strip()):
        raise ConfigError("server.openai_api_key must be at least 16 characters, without surrounding spaces")
    return None


# [server.tcp_restricted]: Triton API category -> "HEADER=VALUE" a loopback TCP request of it must carry
_TCP_CHECK = {"check": _tcp_restricted, "secret": True}


@dataclass(frozen=True)
class AccessConfig:
    """Who may do what over the Unix socket, by peer credentials. Empty infer lists: anyone who can connect
    may run inference. Administrators are root and the daemon's own user always, plus these lists."""

    infer_users: tuple[str, ...] = ()  # with infer_groups empty too: anyone who can connect may infer
    infer_groups: tuple[str, ...] = ()
    admin_users: tuple[str, ...] = ()  # may load and unload; root and the daemon's own user always may
    admin_groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServerConfig:
    socket: str | None = None  # None: $RUNTIME_DIRECTORY, then $XDG_RUNTIME_DIR/edged, then /tmp/edged-$UID
    socket_mode: str = field(default="0660", metadata={"check": _octal_mode})
    socket_group: str | None = None
    http_port: int | None = field(default=None, metadata={"check": _port})  # loopback TCP; off when None
    http_host: str = "127.0.0.1"
    # A non-loopback http_host exposes inference with no access control to the network: refused unless set.
    http_allow_non_loopback: bool = False
    # KServe v2 gRPC (Triton's GRPCInferenceService, edged.grpcapi): loopback TCP on grpc_host:grpc_port
    # (non-loopback only with http_allow_non_loopback) and/or a Unix socket edged creates itself, with
    # socket_mode and socket_group. Both off when None. Messages up to grpc_max_message_mb each way.
    grpc_port: int | None = field(default=None, metadata={"check": _port})
    grpc_host: str = "127.0.0.1"
    grpc_socket: str | None = None
    grpc_max_message_mb: int = field(default=64, metadata={"check": _grpc_message_mb})
    # Answers one gRPC connection may hold unsent (its client's windows closed or not reading): past it new calls
    # and further answers get RESOURCE_EXHAUSTED; one answer of any size is sent when nothing else waits.
    grpc_max_unsent_mb: int = field(default=64, metadata={"check": _positive})
    listen_backlog: int = field(default=128, metadata={"check": _positive})
    max_body_bytes: int = field(default=64 * 1024 * 1024, metadata={"check": _positive})
    # Bodies of all requests held at once (read, decoding or running): four maximal bodies on a 4 GB device.
    max_inflight_body_bytes: int = field(default=256 * 1024 * 1024, metadata={"check": _positive})
    max_connections: int = field(default=1024, metadata={"check": _positive})
    fd_reserve: int = field(default=64, metadata={"check": _positive})  # descriptors kept for the daemon's files
    max_header_bytes: int = field(default=16 * 1024, metadata={"check": _positive})
    max_tensor_elements: int = field(default=64 * 1024 * 1024, metadata={"check": _positive})
    request_timeout_s: float = field(default=30.0, metadata={"check": _positive})
    idle_timeout_s: float = field(default=300.0, metadata={"check": _positive})
    shutdown_timeout_s: float = field(default=10.0, metadata={"check": _positive})  # request drain, each step
    # The whole stop (HTTP and MQTT drains, model unloads): keep below the unit's TimeoutStopSec (45 s).
    stop_timeout_s: float = field(default=30.0, metadata={"check": _positive})  # all of the stop, < TimeoutStopSec
    # System shared memory (Triton's extension): how many regions clients may register and how much they map.
    shm_max_regions: int = field(default=64, metadata={"check": _positive})
    shm_max_bytes_mb: int = field(default=1024, metadata={"check": _positive})
    access: AccessConfig = AccessConfig()
    tcp_restricted: dict[str, str] = field(default_factory=dict, metadata=_TCP_CHECK)  # category = "HEADER=VALUE"
    # /v1 (OpenAI) routes over loopback TCP need "Authorization: Bearer <key>" when one of these is set; the
    # file (its first line) keeps the key out of the toml. The Unix socket's mode and group stay its control.
    openai_api_key: str | None = field(default=None, metadata={"check": _api_key, "secret": True})
    openai_api_key_file: str | None = None

    @property
    def sweep_interval_s(self) -> float:
        """How often the front ends look for idle connections and stalled requests: a few times per timeout, so
        either fires within a quarter of its value late, never more often than 20 times a second."""
        return max(0.05, min(1.0, self.idle_timeout_s / 4, self.request_timeout_s / 4))

    def __post_init__(self) -> None:
        if self.openai_api_key is not None and self.openai_api_key_file is not None:
            raise ValueError("set server.openai_api_key or server.openai_api_key_file, not both")
        if self.socket is not None and self.grpc_socket is not None and \
                Path(self.socket).absolute() == Path(self.grpc_socket).absolute():
            raise ValueError(f"server.socket and server.grpc_socket name the same path ({self.socket}): the HTTP "
                             "and the gRPC front end each need their own socket; give grpc_socket another name")
        if self.http_port and self.http_port == self.grpc_port and self.http_host == self.grpc_host:
            raise ValueError(f"server.http_port and server.grpc_port are both {self.http_port} on {self.http_host}: "
                             "the HTTP and the gRPC front end each need their own port (Triton's are 8000 and 8001)")
        if self.max_inflight_body_bytes < self.max_body_bytes:
            raise ValueError(f"max_inflight_body_bytes ({self.max_inflight_body_bytes}) must be at least "
                             f"max_body_bytes ({self.max_body_bytes}), or no request of the largest size fits")

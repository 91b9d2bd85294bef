"""What the gRPC tests share besides the fixture (a module of its own: test modules importing ``conftest`` by
name would get whichever conftest was imported last)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from integration.edged_daemon import DaemonProcess

SHM_KEY = ("edged-key", "grpc-test-key")
MAX_MESSAGE_MB = 8


@dataclass
class GrpcDaemon:
    daemon: DaemonProcess
    tcp: str  # host:port for tritonclient.grpc
    unix: str  # unix:///path
    socket_path: Path

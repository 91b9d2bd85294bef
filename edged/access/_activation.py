"""The sockets systemd passes (sd_listen_fds(3): LISTEN_PID, LISTEN_FDS, LISTEN_FDNAMES), sorted by name
for the front end each belongs to.

systemd names every descriptor of a socket unit by that unit's ``FileDescriptorName=`` (one name per unit,
default the unit's own name), so each front end's socket comes from its own unit: ``edged.socket`` names
its descriptor ``edged`` (the HTTP API) and ``edged-grpc.socket`` names its ``grpc``. Descriptors are taken
only when LISTEN_PID names this process. One with no name (LISTEN_FDNAMES unset, or systemd's ``unknown``)
is the HTTP API's, as before names existed; one with any other name is a ConfigError naming it and the
names edged knows: serving a socket meant for something else, or leaving one nobody serves while systemd
queues clients on it, would fail in the field without a word.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from edged.errors import ConfigError

SD_LISTEN_FDS_START = 3
HTTP_NAME = "edged"
GRPC_NAME = "grpc"
_UNNAMED = frozenset({"", "unknown"})  # sd_listen_fds_with_names(3) reports "unknown" for an unnamed one


@dataclass(frozen=True)
class Activated:
    """Inherited sockets by front end, each with the name systemd gave it."""

    http: list[tuple[str, socket.socket]] = field(default_factory=list)
    grpc: list[tuple[str, socket.socket]] = field(default_factory=list)


def activated_sockets(environ: Mapping[str, str]) -> Activated:
    """The sockets passed to this process, by front end; none when LISTEN_PID names another process."""
    if environ.get("LISTEN_PID", "") != str(os.getpid()):
        return Activated()
    text = environ.get("LISTEN_FDS", "0")
    try:
        count = int(text)
    except ValueError:
        raise ConfigError(f"LISTEN_FDS is {text!r}, expected a number") from None
    names = environ.get("LISTEN_FDNAMES", "").split(":") if environ.get("LISTEN_FDNAMES") else []
    unknown = sorted({name for name in names[:count] if name not in (HTTP_NAME, GRPC_NAME) and name not in _UNNAMED})
    if unknown:
        raise ConfigError(f"systemd passed sockets named {', '.join(map(repr, unknown))} (LISTEN_FDNAMES); edged "
                          f"serves {HTTP_NAME!r} (the HTTP API, edged.socket) and {GRPC_NAME!r} (gRPC, "
                          "edged-grpc.socket): set FileDescriptorName= in that socket unit to one of them")
    found = Activated()
    for index in range(count):
        fd = SD_LISTEN_FDS_START + index
        os.set_inheritable(fd, False)
        name = names[index] if index < len(names) else ""
        (found.grpc if name == GRPC_NAME else found.http).append((name, socket.socket(fileno=fd)))
    return found

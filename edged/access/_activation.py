"""The sockets systemd passes (sd_listen_fds(3): LISTEN_PID, LISTEN_FDS, LISTEN_FDNAMES), sorted by name
for the front end each belongs to.

systemd names every descriptor of a socket unit by that unit's ``FileDescriptorName=`` (one name per unit,
default the unit's own name), so each front end's socket comes from its own unit: ``edged.socket`` names
its descriptor ``edged`` (the HTTP API) and ``edged-grpc.socket`` names its ``grpc``. Descriptors are taken
only when LISTEN_PID names this process. One with no name (LISTEN_FDNAMES unset, or systemd's ``unknown``)
is the HTTP API's, as before names existed; one with any other name is a ConfigError naming it and the
names edged knows: serving a socket meant for something else, or leaving one nobody serves while systemd
queues clients on it, would fail in the field without a word.

Each descriptor is checked before it is used: it must be open, a socket, of a Unix or TCP family, a stream
socket and listening. Anything else (LISTEN_FDS counting more descriptors than were passed, a file, a
datagram socket, one never bound or listened on) is a ConfigError naming the descriptor, its name and the
socket unit to check, rather than a traceback from deep in the event loop.
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field

from edged.errors import ConfigError

SD_LISTEN_FDS_START = 3
HTTP_NAME = "edged"
GRPC_NAME = "grpc"
_UNNAMED = frozenset({"", "unknown"})  # sd_listen_fds_with_names(3) reports "unknown" for an unnamed one
_UNITS = {HTTP_NAME: "edged.socket", GRPC_NAME: "edged-grpc.socket"}
_TYPES: dict[int, str] = {socket.SOCK_DGRAM: "SOCK_DGRAM", socket.SOCK_SEQPACKET: "SOCK_SEQPACKET",
                          socket.SOCK_RAW: "SOCK_RAW"}
_FAMILIES = {socket.AF_UNIX: "a Unix", socket.AF_INET: "an IPv4", socket.AF_INET6: "an IPv6"}


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
    named = [(SD_LISTEN_FDS_START + index, names[index] if index < len(names) else "") for index in range(count)]
    for fd, name in named:  # all checked before any is taken: a refused start leaves no half-adopted sockets
        problem = _not_a_listening_stream_socket(fd)
        if problem:
            unit = _UNITS.get(name, "the .socket unit that passes it")
            raise ConfigError(f"socket activation: fd {fd} ({name or 'unnamed'}, one of LISTEN_FDS={count}) "
                              f"{problem}; edged expects a listening Unix or TCP stream socket: check "
                              f"ListenStream= in {unit}, and that LISTEN_FDS counts only the sockets passed")
    found = Activated()
    for fd, name in named:
        os.set_inheritable(fd, False)
        (found.grpc if name == GRPC_NAME else found.http).append((name, socket.socket(fileno=fd)))
    return found


def _not_a_listening_stream_socket(fd: int) -> str:
    """What is wrong with ``fd`` as an activated socket, or "" when it is a listening stream socket."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return "is not open (LISTEN_FDS counts more descriptors than were passed)"
    if not stat.S_ISSOCK(mode):
        what = ("a regular file" if stat.S_ISREG(mode) else "a pipe" if stat.S_ISFIFO(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a directory" if stat.S_ISDIR(mode)
                else "another kind of descriptor")
        return f"is not a socket ({what})"
    # detached, never closed: a descriptor refused here (perhaps not systemd's at all) is left as it was
    probe = socket.socket(fileno=fd)
    try:
        if probe.family not in _FAMILIES:
            return f"has address family {probe.family!r}"
        kind = probe.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE)
        if kind != socket.SOCK_STREAM:
            kind_name = _TYPES.get(kind, f"type {kind}")
            return f"is {_FAMILIES[probe.family]} {kind_name} socket, not SOCK_STREAM"
        if not probe.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            return f"is {_FAMILIES[probe.family]} stream socket that is not listening (never bound or listen()ed)"
        return ""
    finally:
        probe.detach()

"""Where the daemon's Unix socket is: the one search order shared by the client and every CLI command.

Order: an explicit path (alone, when given), ``$EDGED_SOCKET``, systemd's ``$RUNTIME_DIRECTORY/edged.sock``,
``$XDG_RUNTIME_DIR/edged/edged.sock``, ``/tmp/edged-$UID/edged.sock``, ``/run/edged/edged.sock``. The first
that exists is used; when none answers, the error names every path tried and how to start the daemon.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from dataclasses import dataclass

from edged.errors import ServerUnreachable

SYSTEM_SOCKET = "/run/edged/edged.sock"
START_HINT = "start the daemon with `edged serve` (or `sudo systemctl start edged`), or name its socket with " \
             "--socket PATH or $EDGED_SOCKET"


@dataclass(frozen=True)
class SocketSearch:
    """The candidates in order; ``existing`` are those present on disk, in the same order."""

    candidates: tuple[str, ...]
    existing: tuple[str, ...]

    def unreachable(self, reason: str = "") -> ServerUnreachable:
        return ServerUnreachable(unreachable_message(self.candidates, reason))


def socket_candidates(explicit: str | os.PathLike[str] | None = None,
                      environ: Mapping[str, str] | None = None, uid: int | None = None) -> tuple[str, ...]:
    if explicit is not None and os.fspath(explicit):
        return (os.fspath(explicit),)
    env = os.environ if environ is None else environ
    found: list[str] = []
    if env.get("EDGED_SOCKET"):
        found.append(env["EDGED_SOCKET"])
    if env.get("RUNTIME_DIRECTORY"):
        # systemd joins several RuntimeDirectory= entries with ':'; edged's is the first
        found.append(os.path.join(env["RUNTIME_DIRECTORY"].split(":")[0], "edged.sock"))
    if env.get("XDG_RUNTIME_DIR"):
        found.append(os.path.join(env["XDG_RUNTIME_DIR"], "edged", "edged.sock"))
    found.append(os.path.join("/tmp", f"edged-{os.getuid() if uid is None else uid}", "edged.sock"))
    found.append(SYSTEM_SOCKET)
    return tuple(dict.fromkeys(found))


def find_sockets(explicit: str | os.PathLike[str] | None = None,
                 environ: Mapping[str, str] | None = None) -> SocketSearch:
    candidates = socket_candidates(explicit, environ)
    return SocketSearch(candidates, tuple(path for path in candidates if os.path.exists(path)))


_DENIED = "this user may not open the socket"


def connect_failure(path: str, error: OSError) -> str:
    """Why connecting to ``path`` failed; a refused permission means a daemon may well be running, so the text says
    how to get access (naming the socket's own group) rather than how to start one."""
    reason = f"{path}: {error.strerror or error}"
    if error.errno in (errno.EACCES, errno.EPERM):
        reason += (f" ({_DENIED}: run as a member of its group, e.g. `sudo usermod -aG {_group_of(path)} $USER` "
                   "and log in again, or as the daemon's user)")
    return reason


def _group_of(path: str) -> str:
    try:
        gid = os.stat(path).st_gid
    except OSError:
        return "edged"  # its folder is closed to this user too: the shipped unit's group
    try:
        import grp
        return grp.getgrgid(gid).gr_name
    except (ImportError, KeyError):
        return str(gid)


def unreachable_message(tried: tuple[str, ...] | list[str], reason: str = "") -> str:
    paths = ", ".join(tried)
    detail = f" ({reason})" if reason else ""
    if _DENIED in reason:  # a daemon is there: starting one is not the fix
        return f"edged's socket refused this user on {paths}{detail}"
    return f"no edged daemon answered on {paths}{detail}; {START_HINT}"

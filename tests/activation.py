"""systemd's socket passing without systemd, shared by the socket-activation tests: a ``python -c`` wrapper
that sets LISTEN_PID (and the like) to its own pid, puts the passed descriptors at 3, 4, ... as systemd does,
and execs the daemon, which keeps that pid."""

from __future__ import annotations

import sys

# argv: -c, "VAR,VAR", "fd,fd" to put at 3, 4, ... ("" or -1 for none), then the daemon's command line. The
# descriptors are first copied above 100, so that one already at a target number is not overwritten.
EXEC_WRAPPER = ("import fcntl, os, sys\n"
                "for name in filter(None, sys.argv[1].split(',')): os.environ[name] = str(os.getpid())\n"
                "fds = [int(fd) for fd in sys.argv[2].split(',') if fd and int(fd) >= 0]\n"
                "copies = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]\n"
                "for fd in fds: os.close(fd)\n"
                "for index, fd in enumerate(copies): os.dup2(fd, 3 + index); os.close(fd)\n"
                "os.execv(sys.argv[3], sys.argv[3:])\n")


def wrapper(pid_variables: str, *fds: int) -> list[str]:
    return [sys.executable, "-c", EXEC_WRAPPER, pid_variables, ",".join(str(fd) for fd in fds)]

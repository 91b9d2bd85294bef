"""A real service manager for edged-update's tests, in place of systemd: ``start`` runs the installed tree's
``edged serve`` (whatever ``/opt/edged/current`` points at when it starts) in its own mount namespace, with the
staged ``ROOT/opt/edged`` bind-mounted at /opt/edged where its paths point; ``stop`` sends SIGTERM, then SIGKILL,
and returns once the daemon has exited.

Usage: python release_supervisor.py --pidfile F --root R --config C --log L start|stop
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

FAKES = Path(__file__).resolve().parents[1] / "engine"
MOUNT = ('mount -t tmpfs edged-opt /opt && mkdir /opt/edged && mount --bind "$1/opt/edged" /opt/edged && '
         'exec /opt/edged/current/bin/edged serve --config "$2"')


def running(pidfile: Path) -> int | None:
    try:
        pid = int(pidfile.read_text())
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    return None if state in ("Z", "X") else pid  # a zombie has stopped (its parent, this script, is gone)


def start(args: argparse.Namespace) -> None:
    if running(args.pidfile) is not None:
        return
    # nothing of the test run's, but the test backend (tests/engine/engine_fakes.py) the models use
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONPATH": str(FAKES)}
    with open(args.log, "ab") as log:
        child = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", MOUNT, "edged",
                                  args.root, args.config], stdout=log, stderr=subprocess.STDOUT, env=env, cwd="/",
                                 start_new_session=True)
    args.pidfile.write_text(str(child.pid))


def stop(args: argparse.Namespace) -> None:
    """Returns only once the daemon has exited, as ``systemctl stop`` does: the next start would otherwise find
    the state directory still locked by it (edged.daemon._lock) and refuse to run."""
    pid = running(args.pidfile)
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    if not _exited(args.pidfile, pid, 30):
        os.kill(pid, signal.SIGKILL)
        if not _exited(args.pidfile, pid, 30):
            raise SystemExit(f"edged (PID {pid}) still running 30 s after SIGKILL")
    args.pidfile.unlink(missing_ok=True)


def _exited(pidfile: Path, pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while running(pidfile) is not None:
        if time.monotonic() >= deadline:
            return False
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    return True


def main() -> int:
    parser = argparse.ArgumentParser()
    for flag in ("--pidfile", "--root", "--config", "--log"):
        parser.add_argument(flag, type=Path, required=True)
    parser.add_argument("action", choices=("start", "stop"))
    args = parser.parse_args()
    (start if args.action == "start" else stop)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

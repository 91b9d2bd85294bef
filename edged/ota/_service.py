"""The service manager edged-update drives: a narrow seam (stop, start) so tests run a real daemon without systemd.

Production runs ``systemctl stop|start edged.service``; tests give a command template that starts and stops a
real ``edged serve`` of the installed tree. A failing command is an `UpdateRejected` naming it and its output.
"""

from __future__ import annotations

import shlex
import subprocess
from typing import Protocol

from edged.errors import UpdateRejected

# the socket too: a connection while edged is stopped would otherwise start the new release before the backups
SYSTEMCTL = "systemctl {action} edged.socket edged.service"


class ServiceManager(Protocol):
    def stop(self) -> None: ...

    def start(self, timeout_s: float | None = None) -> None:
        """``timeout_s``: how long the start may take (``systemctl start`` returns once a Type=notify daemon is
        READY: models load first); None: the manager's own timeout."""


class CommandManager:
    def __init__(self, template: str = SYSTEMCTL, timeout_s: float = 120.0) -> None:
        if "{action}" not in template:
            raise UpdateRejected(f"--service-command {template!r}: expected {{action}} (replaced by stop or start)")
        self.template = template
        self.timeout_s = timeout_s

    def stop(self) -> None:
        self._run("stop")

    def start(self, timeout_s: float | None = None) -> None:
        self._run("start", timeout_s)

    def _run(self, action: str, timeout_s: float | None = None) -> None:
        argv = shlex.split(self.template.replace("{action}", action))
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s or self.timeout_s,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise UpdateRejected(f"service manager: {shlex.join(argv)}: {e}") from e
        if done.returncode != 0:
            raise UpdateRejected(f"service manager: {shlex.join(argv)} exited with {done.returncode}: "
                                 f"{(done.stderr or done.stdout).strip()[-400:]}")

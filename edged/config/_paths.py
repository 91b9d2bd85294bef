"""Where state lives when the config does not say: one rule for the daemon, telemetry and the tools."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def resolve_state_dir(configured: str | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """``state_dir`` from the config, else $STATE_DIRECTORY (systemd's StateDirectory=, the first of several),
    else $XDG_STATE_HOME/edged, else ~/.local/state/edged."""
    if configured:
        return Path(configured)
    env = os.environ if environ is None else environ
    if env.get("STATE_DIRECTORY"):
        return Path(env["STATE_DIRECTORY"].split(":")[0])
    if env.get("XDG_STATE_HOME"):
        return Path(env["XDG_STATE_HOME"]) / "edged"
    home = env.get("HOME") or str(Path.home())
    return Path(home) / ".local" / "state" / "edged"

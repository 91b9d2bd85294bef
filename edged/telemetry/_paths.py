"""Where the telemetry database lives when the config does not say."""

from __future__ import annotations

import os
from pathlib import Path


def default_state_dir(state_dir: str | None = None) -> Path:
    """``state_dir``, else $STATE_DIRECTORY (systemd), else $XDG_STATE_HOME/edged, else ~/.local/state/edged.
    """
    if state_dir:
        return Path(state_dir)
    systemd = os.environ.get("STATE_DIRECTORY")
    if systemd:
        return Path(systemd.split(":")[0])
    xdg = os.environ.get("XDG_STATE_HOME")
    if xdg:
        return Path(xdg) / "edged"
    return Path.home() / ".local" / "state" / "edged"


def default_database_path(state_dir: str | None = None, database: str | None = None) -> str:
    """``[telemetry] database`` when set, else ``<state dir>/telemetry.db``."""
    return database or str(default_state_dir(state_dir) / "telemetry.db")

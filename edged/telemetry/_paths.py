"""Where the telemetry database lives when the config does not say."""

from __future__ import annotations

from pathlib import Path

from edged.config._paths import resolve_state_dir


def default_state_dir(state_dir: str | None = None) -> Path:
    """``state_dir``, else the daemon's default state directory (see edged.config.resolve_state_dir)."""
    return resolve_state_dir(state_dir)


def default_database_path(state_dir: str | None = None, database: str | None = None) -> str:
    """``[telemetry] database`` when set, else ``<state dir>/telemetry.db``."""
    return database or str(default_state_dir(state_dir) / "telemetry.db")

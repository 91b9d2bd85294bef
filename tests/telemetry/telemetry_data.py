"""Paths and recorded data shared by the telemetry tests (a uniquely named module, not conftest)."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TEGRASTATS = FIXTURES / "tegrastats"
SYSFS = FIXTURES / "sysfs"


def recorded_lines(name: str | None = None) -> list[str]:
    """The recorded tegrastats lines of one fixture file (or all), comments stripped."""
    files = [TEGRASTATS / name] if name else sorted(TEGRASTATS.glob("*.log"))
    return [ln for f in files for ln in f.read_text(encoding="utf-8").splitlines()
            if ln.strip() and not ln.startswith("#")]

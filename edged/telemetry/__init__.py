"""Telemetry in place of DCGM: sources, the tegrastats parser, the SQLite history, energy per inference.

Public API (everything else is private):
- `TelemetryService(config, database, activity=None, source=None)`: start()/stop(), snapshot(),
  render_prometheus(), record_event(kind, subject, detail), choice.
- `choose_source(config) -> SourceChoice(name, reason)`, `describe_source(config) -> str`: which source
  ``auto`` picks and why, for the daemon's log and `edged doctor`.
- `ModelActivity`: the Protocol the engine implements ((model, version) -> cumulative (count, compute_ns)).
- `parse_tegrastats(line) -> Sample`, `Sample.to_json()`: the ``edged telemetry parse`` contract.
- `summary_payload(snapshot, previous, max_bytes)`, `render_prometheus(snapshot)`.
- `default_database_path(state_dir, database)`; `TelemetryReader(path)` with summary(), points(), events();
  `parse_duration("6h")`; `plot_history(reader, since_s, out_path)` in `edged.telemetry.plot` (matplotlib).

Names are imported on first use (PEP 562), so that ``edged telemetry summary`` loads only the reader and not
the service, the sources and the parser; each name still lives in exactly one private module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edged.telemetry._derived import Event, ModelActivity
    from edged.telemetry._export import render_prometheus, summary_payload
    from edged.telemetry._paths import default_database_path
    from edged.telemetry._query import Point, TelemetryReader, parse_duration
    from edged.telemetry._sample import CpuCore, Engine, Rail, Sample
    from edged.telemetry._service import TelemetryService
    from edged.telemetry._source import (
        SourceChoice,
        TelemetrySource,
        choose_source,
        describe_source,
        open_source,
    )
    from edged.telemetry.tegrastats import parse_tegrastats

_HOME = {
    "Event": "_derived", "ModelActivity": "_derived", "render_prometheus": "_export",
    "summary_payload": "_export", "default_database_path": "_paths", "Point": "_query",
    "TelemetryReader": "_query", "parse_duration": "_query", "CpuCore": "_sample", "Engine": "_sample",
    "Rail": "_sample", "Sample": "_sample", "TelemetryService": "_service", "SourceChoice": "_source",
    "TelemetrySource": "_source", "choose_source": "_source", "describe_source": "_source",
    "open_source": "_source", "parse_tegrastats": "tegrastats",
}

__all__ = [
    "CpuCore", "Engine", "Event", "ModelActivity", "Point", "Rail", "Sample", "SourceChoice",
    "TelemetryReader", "TelemetryService", "TelemetrySource", "choose_source", "default_database_path",
    "describe_source",
    "open_source", "parse_duration", "parse_tegrastats", "render_prometheus", "summary_payload",
]


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'edged.telemetry' has no attribute {name!r}")
    return getattr(importlib.import_module(f"edged.telemetry.{module}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)

"""The ``[ota]`` and ``[logging]`` sections."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class OtaConfig:
    enabled: bool = False
    repository_url: str | None = None
    check_interval_s: float = 3600.0


@dataclass(frozen=True)
class LoggingConfig:
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "journald", "plain"] = "auto"

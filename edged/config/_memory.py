"""The ``[memory]`` section: allocator, budget, admission control."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


def _non_negative(value: float | None) -> str | None:
    return None if value is None or value >= 0 else "expected a number >= 0"


def _percent(value: float | None) -> str | None:
    return None if value is None or 0 < value <= 100 else "expected a percentage in (0, 100]"


@dataclass(frozen=True)
class MemoryConfig:
    allocator: Literal["system", "jemalloc", "tcmalloc"] = "system"
    budget_mb: float | None = field(default=None, metadata={"check": _non_negative})
    budget_percent: float | None = field(default=None, metadata={"check": _percent})
    policy: Literal["refuse", "evict_lru"] = "refuse"
    release_after_unload: bool = True
    pressure_min_available_mb: float = field(default=256.0, metadata={"check": _non_negative})
    pressure_some_avg10_max: float = field(default=40.0, metadata={"check": _non_negative})
    pressure_check_interval_s: float = 2.0

"""The ``[memory]`` section: allocator, budget, admission control, pressure thresholds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# jemalloc returns freed pages to the kernel by itself within about a second with these settings
# (docs/field-notes.md: back to baseline in ~11 s with dirty_decay_ms alone; the default decay is 10 s).
DEFAULT_JEMALLOC_CONF = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:1000"


def _non_negative(value: float | None) -> str | None:
    return None if value is None or value >= 0 else "expected a number >= 0"


def _positive(value: float) -> str | None:
    return None if value > 0 else "expected a number > 0"


def _positive_or_none(value: float | None) -> str | None:
    return None if value is None or value > 0 else "expected a number > 0"


def _percent(value: float | None) -> str | None:
    return None if value is None or 0 < value <= 100 else "expected a percentage in (0, 100]"


def _release_rate(value: float) -> str | None:
    return None if 0 <= value <= 10 else "expected a tcmalloc release rate in [0, 10]"


@dataclass(frozen=True)
class MemoryConfig:
    allocator: Literal["system", "jemalloc", "tcmalloc"] = "system"
    # An explicit shared library for `allocator`; empty: search the multiarch library directories.
    allocator_library: str = ""
    # Applied on re-exec only when the environment does not already set MALLOC_CONF / TCMALLOC_RELEASE_RATE
    # (a systemd drop-in wins).
    jemalloc_conf: str = DEFAULT_JEMALLOC_CONF
    tcmalloc_release_rate: float = field(default=10.0, metadata={"check": _release_rate})
    budget_mb: float | None = field(default=None, metadata={"check": _non_negative})
    budget_percent: float | None = field(default=None, metadata={"check": _percent})
    policy: Literal["refuse", "evict_lru"] = "refuse"
    # A model file's peak need while loading, before it was first loaded, = file size (with an ONNX model's
    # external data) x this factor; later loads of the same file use the peak measured then (VmHWM). None: by
    # allocator, as measured for ONNX on CPU through the daemon (docs/benchmarks.md): 5.5 on glibc (3.1-5.3x
    # seen), 3.5 with jemalloc/tcmalloc (2.4-3.1x).
    load_estimate_factor: float | None = field(default=None, metadata={"check": _positive_or_none})
    # Give freed heap back to the kernel (malloc_trim / purge) after each unload, and also after each load,
    # auto-complete pass and failed load, so a model is charged what it holds rather than the heap's leftovers.
    release_after_unload: bool = True
    pressure_min_available_mb: float = field(default=256.0, metadata={"check": _non_negative})
    pressure_some_avg10_max: float = field(default=40.0, metadata={"check": _non_negative})
    pressure_check_interval_s: float = field(default=2.0, metadata={"check": _positive})

    def __post_init__(self) -> None:
        if self.budget_mb is not None and self.budget_percent is not None:
            raise ValueError(
                f"set memory.budget_mb or memory.budget_percent, not both "
                f"(found budget_mb={self.budget_mb}, budget_percent={self.budget_percent})")

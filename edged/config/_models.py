"""The ``[models]`` section: where models come from and how they are loaded."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


def _positive(value: float) -> str | None:
    return None if value > 0 else "expected a positive number"


@dataclass(frozen=True)
class ModelsConfig:
    repository: str | None = None  # None: the bundled sample models
    control_mode: Literal["none", "explicit", "poll"] = "none"
    load: Literal["eager", "lazy"] = "eager"
    startup_models: tuple[str, ...] = ()  # with control_mode "explicit": models to load at start ("*" = all)
    poll_interval_s: float = field(default=5.0, metadata={"check": _positive})
    # A model whose measured execution time is below this runs on the event loop when idle, saving the
    # thread hop (about 70 µs on these machines, see docs/field-notes.md); slower ones run on worker threads.
    inline_execution_max_us: int = 1000
    warmup: bool = True
    # How a reload of a loaded version meets the memory budget. "side_by_side": the new copy loads beside the
    # serving one and replaces it when ready; when both do not fit the reload is refused and the old copy keeps
    # serving. "replace": the old copy is unloaded first, so the version is briefly unavailable. "auto": side
    # by side when both copies fit the budget, replace when they do not.
    reload: Literal["auto", "side_by_side", "replace"] = "auto"
    # As Triton's --disable-auto-complete-config when false: configs must list inputs and outputs themselves.
    autocomplete: bool = True
    # The most instances one model version may ask for (instance_group count, summed over its groups): each is
    # a copy of the model of its own, so thousands would exhaust the device's memory (Triton sets no limit).
    max_instance_count: int = field(default=64, metadata={"check": _positive})
    # An execution (warm-up runs included) running longer than this means a wedged backend: the systemd watchdog
    # pings stop and the health board's "engine" part is degraded; a warm-up run past it fails that load.
    stall_timeout_s: float = field(default=120.0, metadata={"check": _positive})  # seconds: a run past it is wedged
    # Extra backends by name, "module:Class" (a Triton-style custom backend implementing edged's Backend
    # protocol); they may also replace a built-in name.
    backends: dict[str, str] = field(default_factory=dict)

"""The lifecycle of a model version as an explicit state machine (no I/O here).

    loading -> ready -> unloading -> unloaded
    loading -> failed (with the reason)
    loading -> unloaded (with the reason: admission refused the load before it began, nothing was made)
    ready   -> failed  (e.g. the watchdog finds the backend dead)

A transition not in the table is a programmer error (RuntimeError), not bad input.
"""

from __future__ import annotations

import enum
import threading
import time


class ModelState(enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNLOADED = "UNAVAILABLE"  # Triton's repository index calls an unloaded model UNAVAILABLE
    FAILED = "FAILED"


_ALLOWED: dict[ModelState, frozenset[ModelState]] = {
    ModelState.LOADING: frozenset({ModelState.READY, ModelState.FAILED, ModelState.UNLOADED}),
    ModelState.READY: frozenset({ModelState.UNLOADING, ModelState.FAILED}),
    ModelState.UNLOADING: frozenset({ModelState.UNLOADED}),
    ModelState.FAILED: frozenset({ModelState.UNLOADED}),
    ModelState.UNLOADED: frozenset(),
}


class Lifecycle:
    """Guarded state of one model version; ``reason`` explains FAILED and UNLOADED."""

    def __init__(self) -> None:
        # A plain attribute, not a property: every request reads it. Only `move` writes it.
        self.state = ModelState.LOADING
        self._reason = ""
        self._changed_at = time.time()
        self._lock = threading.Lock()

    @property
    def reason(self) -> str:
        return self._reason

    @property
    def changed_at(self) -> float:
        return self._changed_at

    def move(self, target: ModelState, reason: str = "") -> None:
        with self._lock:
            if target not in _ALLOWED[self.state]:
                raise RuntimeError(f"model version cannot go from {self.state.value} to {target.value}")
            self.state = target
            self._reason = reason
            self._changed_at = time.time()

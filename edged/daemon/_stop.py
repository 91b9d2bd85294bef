"""`StopBudget`: one deadline for the whole daemon stop, shared out between its steps.

systemd sends SIGKILL when TimeoutStopSec runs out, and a killed daemon loses what it was flushing (the MQTT
outbox's last deliveries, telemetry rows). Each step takes at most what is left, so the stop as a whole ends
within the budget however many models are loaded.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class StopBudget:
    def __init__(self, total_s: float, now: Callable[[], float] = time.monotonic) -> None:
        self.total_s = total_s
        self._now = now
        self._started = now()

    def spent(self) -> float:
        return self._now() - self._started

    def left(self) -> float:
        return max(0.0, self.total_s - self.spent())

    def share(self, fraction: float) -> float:
        """``fraction`` of what is left: for a step that must leave time to the steps after it."""
        return self.left() * fraction

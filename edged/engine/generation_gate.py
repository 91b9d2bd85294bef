"""`SequenceGate`: how many sequences of one generative model run at once and how many requests wait.

Invariant: a request is admitted (``admit``) before its worker starts and leaves (``leave``) exactly once; while
``max_sequences`` generate and ``max_waiting`` wait, the next request is refused at once with `QueueFull`
naming both limits, so a burst costs no thread and no memory beyond the bound.
"""

from __future__ import annotations

import threading

from edged.backends.genai_config import GenerationLimits
from edged.engine.generation_metrics import GenerationStats
from edged.errors import QueueFull

MAX_WAITING = GenerationLimits().max_waiting  # requests per model queued behind the ones generating


class SequenceGate:
    def __init__(self, limits: GenerationLimits | None = None) -> None:
        self.limits = limits or GenerationLimits()
        self.running = threading.BoundedSemaphore(self.limits.max_sequences)
        self.stats = GenerationStats()
        self._count = threading.Lock()
        self.admitted = 0  # generating plus waiting

    def configure(self, limits: GenerationLimits) -> None:
        """Apply a reloaded config's limits; sequences running keep the slot they hold in the old semaphore."""
        with self._count:
            if limits != self.limits:
                self.limits = limits
                self.running = threading.BoundedSemaphore(limits.max_sequences)

    def admit(self, model: str) -> None:
        with self._count:
            limits = self.limits
            if self.admitted >= limits.max_sequences + limits.max_waiting:
                raise QueueFull(f"model {model!r} is generating {limits.max_sequences} sequence(s) (parameter "
                                f"max_sequences) and {limits.max_waiting} requests wait for a slot (parameter "
                                "max_waiting); retry later")
            self.admitted += 1

    def leave(self) -> None:
        with self._count:
            self.admitted -= 1

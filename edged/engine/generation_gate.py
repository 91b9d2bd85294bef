"""`SequenceGate`: how many sequences of one generative model run at once, how many requests wait, and what they
cost, counted since start for ``/metrics``.

Invariant: a request is admitted (``admit``) before its worker starts and leaves (``leave``) exactly once; while
``max_sequences`` generate and ``max_waiting`` wait, the next request is refused at once with `QueueFull`
naming both limits, so a burst costs no thread and no memory beyond the bound.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from edged.errors import QueueFull
from edged.exposition import MetricFamily

MAX_WAITING = 8  # requests per model queued behind the ones generating
OUTCOMES = ("completed", "cancelled", "refused", "failed")


class SequenceGate:
    def __init__(self, max_sequences: int = 1, max_waiting: int = MAX_WAITING) -> None:
        self.max_sequences = max_sequences
        self.max_waiting = max_waiting
        self.running = threading.BoundedSemaphore(max_sequences)
        self._count = threading.Lock()
        self.admitted = 0  # generating plus waiting
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.prompt_tokens = 0
        self.output_tokens = 0

    def record(self, outcome: str, prompt_tokens: int = 0, output_tokens: int = 0) -> None:
        with self._count:
            self.outcomes[outcome] += 1
            self.prompt_tokens += prompt_tokens
            self.output_tokens += output_tokens

    def admit(self, model: str) -> None:
        with self._count:
            if self.admitted >= self.max_sequences + self.max_waiting:
                raise QueueFull(f"model {model!r} is generating {self.max_sequences} sequence(s) and "
                                f"{self.max_waiting} requests wait for it; retry later")
            self.admitted += 1

    def leave(self) -> None:
        with self._count:
            self.admitted -= 1

    @staticmethod
    def metric_families(gates: Sequence[tuple[str, SequenceGate]]) -> list[MetricFamily]:
        requests = MetricFamily("edged_generation_requests_total", "counter",
                                "Generation requests per generative model, by outcome.")
        waiting = MetricFamily("edged_generation_requests_admitted", "gauge",
                               "Generation requests generating or waiting, per model.")
        prompt = MetricFamily("edged_generation_prompt_tokens_total", "counter", "Prompt tokens read, per model.")
        output = MetricFamily("edged_generation_output_tokens_total", "counter", "Tokens generated, per model.")
        for model, gate in gates:
            for outcome, count in gate.outcomes.items():
                requests.add(count, {"model": model, "outcome": outcome})
            waiting.add(gate.admitted, {"model": model})
            prompt.add(gate.prompt_tokens, {"model": model})
            output.add(gate.output_tokens, {"model": model})
        return [requests, waiting, prompt, output]

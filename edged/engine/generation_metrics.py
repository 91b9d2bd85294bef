"""`GenerationStats`: what a generative model's requests cost, as GenAI-Perf reports it, counted since start.

Time to first token runs from admission (``submit``) to the first generated token, so it includes the wait for
a sequence slot, as a client sees it; inter-token latency is each later token's gap to the one before. Output
tokens/s is a request's tokens after the first over its time from the first token to the last, averaged over
requests (GenAI-Perf's per-request throughput; the aggregate rate is ``rate()`` of the output token counter).
Durations come from the monotonic clock, so a wall-clock step changes none of them. The decode time per model
is also what telemetry attributes energy by (engine/service.py ``model_activity``): energy per output token.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from edged.exposition import MetricFamily

OUTCOMES = ("completed", "cancelled", "refused", "failed")
TTFT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
ITL_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class Histogram:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)

    def into(self, family: MetricFamily, labels: Mapping[str, str]) -> None:
        running = 0
        for bound, count in zip(self.bounds, self.counts[:-1], strict=True):
            running += count
            family.add(running, {**labels, "le": repr(bound)}, "_bucket")
        family.add(self.count, {**labels, "le": "+Inf"}, "_bucket")
        family.add(self.total, labels, "_sum")
        family.add(self.count, labels, "_count")


class GenerationStats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.in_flight = 0  # holding a sequence slot
        self.decode_ns = 0  # summed over sequences: first token to last
        self._rate_sum = 0.0  # per-request output tokens/s, summed
        self._rated = 0
        self.ttft = Histogram(TTFT_BUCKETS_S)
        self.itl = Histogram(ITL_BUCKETS_S)

    def started(self) -> None:
        with self._lock:
            self.in_flight += 1

    def first_token(self, seconds: float) -> None:
        with self._lock:
            self.ttft.observe(seconds)

    def token_gaps(self, gaps: Sequence[float]) -> None:
        with self._lock:
            for gap in gaps:
                self.itl.observe(gap)

    def ended(self, outcome: str, prompt_tokens: int, output_tokens: int, decode_ns: int,
              holding: bool) -> None:
        with self._lock:
            self.outcomes[outcome] += 1
            self.prompt_tokens += prompt_tokens
            self.output_tokens += output_tokens
            self.decode_ns += decode_ns
            if holding:
                self.in_flight -= 1
            if output_tokens > 1 and decode_ns > 0:
                self._rate_sum += (output_tokens - 1) / (decode_ns / 1e9)
                self._rated += 1

    @property
    def output_tokens_per_s(self) -> float:
        return self._rate_sum / self._rated if self._rated else 0.0

    def as_json(self) -> dict[str, Any]:
        with self._lock:
            return {"requests": dict(self.outcomes), "prompt_tokens": self.prompt_tokens,
                    "output_tokens": self.output_tokens, "in_flight": self.in_flight,
                    "output_tokens_per_s": round(self.output_tokens_per_s, 3),
                    "time_to_first_token": {"count": self.ttft.count, "sum_s": self.ttft.total},
                    "inter_token_latency": {"count": self.itl.count, "sum_s": self.itl.total}}


def metric_families(stats: Sequence[tuple[str, GenerationStats, int]],
                    energy_mj: Mapping[str, float]) -> list[MetricFamily]:
    """``stats``: (model, its stats, requests admitted: generating or waiting); ``energy_mj``: telemetry's energy
    per unit of work by model, which for a generative model is per output token."""
    requests = MetricFamily("edged_generation_requests_total", "counter",
                            "Generation requests per generative model, by outcome.")
    admitted = MetricFamily("edged_generation_requests_admitted", "gauge",
                            "Generation requests generating or waiting for a sequence slot, per model.")
    in_flight = MetricFamily("edged_generation_requests_in_flight", "gauge",
                             "Generation requests holding a sequence slot (generating), per model.")
    prompt = MetricFamily("edged_generation_prompt_tokens_total", "counter", "Prompt tokens read, per model.")
    output = MetricFamily("edged_generation_output_tokens_total", "counter", "Tokens generated, per model.")
    rate = MetricFamily("edged_generation_output_tokens_per_second", "gauge",
                        "Output tokens per second of one request (first token to last), mean over requests.")
    ttft = MetricFamily("edged_generation_time_to_first_token_seconds", "histogram",
                        "Admission to first generated token, waiting for a sequence slot included.")
    itl = MetricFamily("edged_generation_inter_token_latency_seconds", "histogram",
                       "Gap between successive generated tokens of one request.")
    energy = MetricFamily("edged_generation_energy_per_output_token_millijoules", "gauge",
                          "Module energy attributed to the model per output token, since start (telemetry).")
    for model, stat, waiting in stats:
        labels = {"model": model}
        with stat._lock:
            for outcome, count in stat.outcomes.items():
                requests.add(count, {**labels, "outcome": outcome})
            admitted.add(waiting, labels)
            in_flight.add(stat.in_flight, labels)
            prompt.add(stat.prompt_tokens, labels)
            output.add(stat.output_tokens, labels)
            rate.add(stat.output_tokens_per_s, labels)
            stat.ttft.into(ttft, labels)
            stat.itl.into(itl, labels)
        if model in energy_mj:
            energy.add(energy_mj[model], labels)
    return [requests, admitted, in_flight, prompt, output, rate, ttft, itl, energy]

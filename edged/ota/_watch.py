"""The watch window after a switch: error rate and p99 latency of the new version against the previous one's.

Judged from the engine's per-version statistics (the same numbers /metrics exports), counted from the switch.
"""

from __future__ import annotations

from dataclasses import dataclass

from edged.engine import ModelVersion
from edged.engine.stats import LATENCY_BUCKETS_S

# Below this a 99th percentile is one or two requests (often the first, cold ones): not a measure.
P99_MIN_REQUESTS = 100


@dataclass(frozen=True)
class Health:
    requests: int
    failures: int
    p99_s: float | None

    @property
    def error_rate(self) -> float:
        return self.failures / self.requests if self.requests else 0.0


def health(version: ModelVersion) -> Health:
    doc = version.stats.as_json()["inference_stats"]
    ok, failed = int(doc["success"]["count"]), int(doc["fail"]["count"])
    counts, _, total = version.stats.latency_histogram()
    return Health(ok + failed, failed, _p99(counts, total))


def _p99(counts: list[int], total: int) -> float | None:
    """Upper bound of the histogram bucket holding the 99th percentile (None without traffic)."""
    if total <= 0:
        return None
    running = 0
    for index, count in enumerate(counts):
        running += count
        if running >= 0.99 * total:
            return LATENCY_BUCKETS_S[index] if index < len(LATENCY_BUCKETS_S) else float("inf")
    return float("inf")


def verdict(new: Health, baseline_p99_s: float | None, *, max_error_rate: float, max_p99_ratio: float,
            min_requests: int, window_over: bool) -> tuple[str, str]:
    """("fail" | "pass" | "wait", reason)."""
    if new.requests >= max(min_requests, 1) and new.error_rate > max_error_rate:
        return "fail", (f"error rate {new.error_rate:.1%} over {new.requests} requests in the watch window "
                        f"exceeds max_error_rate {max_error_rate:.1%}")
    if not window_over:
        return "wait", f"watching: {new.requests} requests, {new.failures} failed"
    if new.requests < min_requests:
        return "pass", (f"only {new.requests} requests in the watch window (min_requests {min_requests}): "
                        "confirmed by its test vectors alone")
    if new.requests < P99_MIN_REQUESTS:
        return "pass", (f"healthy over {new.requests} requests ({new.failures} failed); too few to judge p99 "
                        f"(fewer than {P99_MIN_REQUESTS})")
    if baseline_p99_s and new.p99_s is not None and new.p99_s > max_p99_ratio * baseline_p99_s:
        return "fail", (f"p99 latency {new.p99_s * 1e3:.1f} ms is more than max_p99_ratio {max_p99_ratio:g} × "
                        f"the previous version's {baseline_p99_s * 1e3:.1f} ms")
    return "pass", f"healthy over {new.requests} requests ({new.failures} failed)"

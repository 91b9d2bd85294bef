"""Latency summaries: throughput and percentiles from raw samples."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Result:
    label: str
    transport: str
    model: str
    concurrency: int
    batch: int
    requests: int
    errors: int
    seconds: float
    throughput: float  # inferences (requests × batch) per second
    p50_us: float
    p90_us: float
    p99_us: float
    p999_us: float

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(label: str, transport: str, model: str, concurrency: int, batch: int, latencies_us: list[float],
              errors: int, seconds: float) -> Result:
    values = np.asarray(latencies_us, dtype=np.float64) if latencies_us else np.zeros(1)
    p50, p90, p99, p999 = (float(np.percentile(values, q)) for q in (50, 90, 99, 99.9))
    count = len(latencies_us)
    return Result(label, transport, model, concurrency, batch, count, errors, seconds,
                  count * batch / seconds if seconds > 0 else 0.0, p50, p90, p99, p999)


def table(results: list[Result]) -> str:
    header = f"{'scenario':<34} {'conc':>4} {'infer/s':>10} {'p50 µs':>9} {'p99 µs':>9} {'p999 µs':>9} {'errors':>6}"
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(f"{r.label:<34} {r.concurrency:>4} {r.throughput:>10.0f} {r.p50_us:>9.1f} {r.p99_us:>9.1f} "
                     f"{r.p999_us:>9.1f} {r.errors:>6}")
    return "\n".join(lines)

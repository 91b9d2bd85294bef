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
    batching: str = ""  # inproc: "on" or "off" when the scenario forced dynamic batching; "" otherwise
    mean_batch: float = 0.0  # inproc: inferences per backend execution during the measurement; 0 = not known

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
    width = max([34, *(len(r.label) for r in results)])
    header = (f"{'scenario':<{width}} {'conc':>4} {'infer/s':>10} {'p50 µs':>9} {'p99 µs':>9} {'p999 µs':>9} "
              f"{'batch':>6} {'errors':>6}")
    lines = [header, "-" * len(header)]
    for r in results:
        batch = f"{r.mean_batch:>6.1f}" if r.mean_batch else f"{'-':>6}"
        lines.append(f"{r.label:<{width}} {r.concurrency:>4} {r.throughput:>10.0f} {r.p50_us:>9.1f} {r.p99_us:>9.1f} "
                     f"{r.p999_us:>9.1f} {batch} {r.errors:>6}")
    gains = batching_gains(results)
    if gains:
        lines += ["", *gains]
    return "\n".join(lines)


def batching_gains(results: list[Result]) -> list[str]:
    """One line per measurement run both with and without dynamic batching: the throughput ratio."""
    unbatched = {(r.transport, r.model, r.batch, r.concurrency): r for r in results if r.batching == "off"}
    lines = []
    for r in results:
        base = unbatched.get((r.transport, r.model, r.batch, r.concurrency))
        if r.batching != "on" or base is None or not base.throughput:
            continue
        client = r.transport.removeprefix("inproc-")
        lines.append(f"dynamic batching, {r.model} at concurrency {r.concurrency} ({client} callers): "
                     f"{r.throughput / base.throughput:.2f}x the unbatched engine "
                     f"({r.throughput:,.0f} vs {base.throughput:,.0f} infer/s)")
    return lines

"""Per model version statistics with Triton's fields (statistics extension), plus a latency histogram.

Counters are plain integers under one lock. An execution and the requests it served are recorded together
(`record_batch`): one lock round trip and no per-field method calls, because this runs once per batch on the
request path. A lone request's record (`record_alone`, once per request on the fast path) is one tuple kept
under the lock and added to the counters later, by whatever reads them (every reader goes through
`_fold_locked`) or once ``_FOLD_AT`` are kept: the counters read are always those of every request recorded.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# Request latency buckets in seconds for Prometheus (a 14 µs model up to a 10 s one).
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)
# The same bounds in integer nanoseconds, so that recording needs no float division.
_BUCKETS_NS: tuple[int, ...] = tuple(round(bound * 1e9) for bound in LATENCY_BUCKETS_S)
# Lone requests' records kept before they are added to the counters: bounds their memory (a few hundred KiB).
_FOLD_AT = 4096


@dataclass
class _Duration:
    count: int = 0
    ns: int = 0

    def as_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class _BatchStat:
    compute_input: _Duration = field(default_factory=_Duration)
    compute_infer: _Duration = field(default_factory=_Duration)
    compute_output: _Duration = field(default_factory=_Duration)

    def add(self, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One execution of this batch size."""
        self.compute_input.count += 1
        self.compute_input.ns += input_ns
        self.compute_infer.count += 1
        self.compute_infer.ns += infer_ns
        self.compute_output.count += 1
        self.compute_output.ns += output_ns


class VersionStats:
    def __init__(self, model: str, version: str) -> None:
        self.model = model
        self.version = version
        self._lock = threading.Lock()
        self.success = _Duration()
        self.fail = _Duration()
        self.queue = _Duration()
        self.compute_input = _Duration()
        self.compute_infer = _Duration()
        self.compute_output = _Duration()
        self._inference_count = 0
        self.execution_count = 0
        # (batch size, input ns, infer ns, total ns) of lone requests not yet in the counters (module docstring)
        self._alone: list[tuple[int, int, int, int]] = []
        self.last_inference_ms = 0
        self._batches: dict[int, _BatchStat] = {}
        self.latency_counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.latency_sum_ns = 0

    def record_batch(self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int, started_ns: int,
                     finished_ns: int, enqueued_ns: Sequence[int]) -> None:
        """One backend execution and the successful requests it served (enqueued at ``enqueued_ns``)."""
        requests = len(enqueued_ns)
        enqueued_sum = sum(enqueued_ns)
        total_ns = finished_ns * requests - enqueued_sum
        # A batch's requests were queued close together, so their latencies usually share a histogram bucket:
        # then the shortest and the longest decide it, and the batch costs two bisections, not one per request.
        shortest = bisect.bisect_left(_BUCKETS_NS, finished_ns - max(enqueued_ns))
        longest = bisect.bisect_left(_BUCKETS_NS, finished_ns - min(enqueued_ns))
        with self._lock:
            self._execution_locked(batch_size, requests, input_ns, infer_ns, output_ns)
            self.success.count += requests
            self.success.ns += total_ns
            self.queue.count += requests
            self.queue.ns += started_ns * requests - enqueued_sum
            self.latency_sum_ns += total_ns
            counts = self.latency_counts
            if shortest == longest:
                counts[shortest] += requests
            else:
                for enqueued in enqueued_ns:
                    counts[bisect.bisect_left(_BUCKETS_NS, finished_ns - enqueued)] += 1

    @property
    def inference_count(self) -> int:
        with self._lock:
            self._fold_locked()
            return self._inference_count

    def record_alone(self, batch_size: int, input_ns: int, infer_ns: int, started_ns: int, finished_ns: int) -> None:
        """`record_batch` for one request that ran the moment it arrived (no queue time): the counters it leaves,
        once folded, are the ones `record_batch` would. One tuple now; the arithmetic when they are read."""
        record = (batch_size, input_ns, infer_ns, finished_ns - started_ns)
        with self._lock:
            self._alone.append(record)
            self.last_inference_ms = time.time_ns() // 1_000_000
            if len(self._alone) >= _FOLD_AT:
                self._fold_locked()

    def _fold_locked(self) -> None:
        """Add the lone requests' records to the counters (under the lock)."""
        records = self._alone
        if not records:
            return
        self._alone = []
        batches = self._batches
        counts = self.latency_counts
        for batch_size, input_ns, infer_ns, total_ns in records:
            output_ns = total_ns - input_ns - infer_ns
            batch = batches.get(batch_size)
            if batch is None:
                batch = batches[batch_size] = _BatchStat()
            batch.add(input_ns, infer_ns, output_ns)
            self._inference_count += batch_size
            self.compute_input.ns += input_ns
            self.compute_infer.ns += infer_ns
            self.compute_output.ns += output_ns
            self.success.ns += total_ns
            self.latency_sum_ns += total_ns
            counts[bisect.bisect_left(_BUCKETS_NS, total_ns)] += 1
        requests = len(records)
        self.execution_count += requests
        self.compute_input.count += requests
        self.compute_infer.count += requests
        self.compute_output.count += requests
        self.success.count += requests
        self.queue.count += requests

    def record_execution(self, batch_size: int, requests: int, input_ns: int, infer_ns: int,
                         output_ns: int) -> None:
        """One backend execution covering ``requests`` requests and ``batch_size`` inferences."""
        with self._lock:
            self._execution_locked(batch_size, requests, input_ns, infer_ns, output_ns)

    def _execution_locked(self, batch_size: int, requests: int, input_ns: int, infer_ns: int,
                          output_ns: int) -> None:
        self.execution_count += 1
        self._inference_count += batch_size
        self.compute_input.count += requests
        self.compute_input.ns += input_ns * requests
        self.compute_infer.count += requests
        self.compute_infer.ns += infer_ns * requests
        self.compute_output.count += requests
        self.compute_output.ns += output_ns * requests
        batch = self._batches.get(batch_size)
        if batch is None:
            batch = self._batches[batch_size] = _BatchStat()
        batch.add(input_ns, infer_ns, output_ns)
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_request(self, ok: bool, total_ns: int, queue_ns: int) -> None:
        with self._lock:
            if ok:
                self.success.count += 1
                self.success.ns += total_ns
                self.queue.count += 1
                self.queue.ns += queue_ns
                self.latency_counts[bisect.bisect_left(_BUCKETS_NS, total_ns)] += 1
                self.latency_sum_ns += total_ns
            else:
                self.fail.count += 1
                self.fail.ns += total_ns

    def as_json(self) -> dict[str, Any]:
        """Triton's ModelStatistics JSON for this version."""
        with self._lock:
            self._fold_locked()
            return {
                "name": self.model,
                "version": self.version,
                "last_inference": self.last_inference_ms,
                "inference_count": self._inference_count,
                "execution_count": self.execution_count,
                "inference_stats": {
                    "success": self.success.as_json(), "fail": self.fail.as_json(),
                    "queue": self.queue.as_json(), "compute_input": self.compute_input.as_json(),
                    "compute_infer": self.compute_infer.as_json(),
                    "compute_output": self.compute_output.as_json(),
                    "cache_hit": {"count": 0, "ns": 0}, "cache_miss": {"count": 0, "ns": 0},
                },
                "response_stats": {},
                "batch_stats": [
                    {"batch_size": size, "compute_input": b.compute_input.as_json(),
                     "compute_infer": b.compute_infer.as_json(), "compute_output": b.compute_output.as_json()}
                    for size, b in sorted(self._batches.items())
                ],
                "memory_usage": [],
            }

    def latency_histogram(self) -> tuple[list[int], int, int]:
        """(cumulative-free bucket counts, sum ns, count) for Prometheus rendering."""
        with self._lock:
            self._fold_locked()
            return list(self.latency_counts), self.latency_sum_ns, self.success.count

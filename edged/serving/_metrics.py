"""``GET /metrics``: Prometheus text exposition 0.0.4 with Triton's metric names plus edged's own.

Triton's per-model counters (``nv_inference_*``) come from the engine's statistics; durations are cumulative
microseconds as Triton reports them. ``edged_request_duration_seconds`` is a histogram per model version.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from edged.engine import InferenceService
from edged.engine.stats import LATENCY_BUCKETS_S
from edged.exposition import MetricFamily, render

# (metric, help, path into the statistics document, divisor to microseconds or 1 for counts)
_TRITON_METRICS: tuple[tuple[str, str, tuple[str, ...], int], ...] = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     ("inference_stats", "success", "count"), 1),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes",
     ("inference_stats", "fail", "count"), 1),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)",
     ("inference_count",), 1),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)",
     ("execution_count",), 1),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds",
     ("inference_stats", "success", "ns"), 1000),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds",
     ("inference_stats", "queue", "ns"), 1000),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds",
     ("inference_stats", "compute_input", "ns"), 1000),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds",
     ("inference_stats", "compute_infer", "ns"), 1000),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds",
     ("inference_stats", "compute_output", "ns"), 1000),
)


def render_metrics(service: InferenceService, denied: Mapping[str, int], extra: str = "") -> str:
    versions = service.loaded_versions()
    docs = [(v.config.name, v.version_str, v.stats.as_json()) for v in versions]
    families: list[MetricFamily] = []
    for metric, help_text, path, divisor in _TRITON_METRICS:
        family = MetricFamily(metric, "counter", help_text)
        for model, version, doc in docs:
            family.add(_dig(doc, path) // divisor, {"model": model, "version": version})
        families.append(family)
    families.append(_histogram(versions))
    access = MetricFamily("edged_access_denied_total", "counter",
                          "Requests refused by access control (peer credentials on the Unix sockets, "
                          "server.tcp_restricted keys over TCP), HTTP and gRPC, by action")
    for action, count in sorted(denied.items()):
        access.add(count, {"action": action})
    families.append(access)
    text = render(families)
    if extra:
        text += extra if extra.endswith("\n") else extra + "\n"
    return text


def _histogram(versions: Iterable[Any]) -> MetricFamily:
    family = MetricFamily("edged_request_duration_seconds", "histogram",
                          "Inference request duration (queue and compute) per model version")
    for version in versions:
        counts, sum_ns, total = version.stats.latency_histogram()
        labels = {"model": version.config.name, "version": version.version_str}
        cumulative = 0
        for bound, count in zip(LATENCY_BUCKETS_S, counts, strict=False):
            cumulative += count
            family.add(cumulative, {**labels, "le": str(bound)}, "_bucket")
        family.add(total, {**labels, "le": "+Inf"}, "_bucket")
        family.add(sum_ns / 1e9, labels, "_sum")
        family.add(total, labels, "_count")
    return family


def _dig(doc: Mapping[str, Any], path: tuple[str, ...]) -> int:
    value: Any = doc
    for key in path:
        value = value[key]
    return int(value)

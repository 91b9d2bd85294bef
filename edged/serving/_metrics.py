"""``GET /metrics``: Prometheus text exposition 0.0.4 with Triton's metric names plus edged's own.

Triton's per-model counters (``nv_inference_*``) come from the engine's statistics; durations are cumulative
microseconds as Triton reports them. ``edged_request_duration_seconds`` is a histogram per model version.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from edged.engine import InferenceService
from edged.engine.stats import LATENCY_BUCKETS_S

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
    lines: list[str] = []
    for metric, help_text, path, divisor in _TRITON_METRICS:
        lines.append(f"# HELP {metric} {help_text}")
        lines.append(f"# TYPE {metric} counter")
        for model, version, doc in docs:
            lines.append(f"{metric}{_labels(model, version)} {_dig(doc, path) // divisor}")
    lines.extend(_histograms(versions))
    lines.append("# HELP edged_access_denied_total Requests refused by peer-credential access control")
    lines.append("# TYPE edged_access_denied_total counter")
    for action, count in sorted(denied.items()):
        lines.append(f'edged_access_denied_total{{action="{_escape(action)}"}} {count}')
    text = "\n".join(lines) + "\n"
    if extra:
        text += extra if extra.endswith("\n") else extra + "\n"
    return text


def _histograms(versions: Iterable[Any]) -> list[str]:
    name = "edged_request_duration_seconds"
    lines = [f"# HELP {name} Inference request duration (queue and compute) per model version",
             f"# TYPE {name} histogram"]
    for version in versions:
        counts, sum_ns, total = version.stats.latency_histogram()
        base = f'model="{_escape(version.config.name)}",version="{version.version_str}"'
        cumulative = 0
        for bound, count in zip(LATENCY_BUCKETS_S, counts, strict=False):
            cumulative += count
            lines.append(f'{name}_bucket{{{base},le="{bound}"}} {cumulative}')
        lines.append(f'{name}_bucket{{{base},le="+Inf"}} {total}')
        lines.append(f"{name}_sum{{{base}}} {sum_ns / 1e9:.9f}")
        lines.append(f"{name}_count{{{base}}} {total}")
    return lines


def _dig(doc: Mapping[str, Any], path: tuple[str, ...]) -> int:
    value: Any = doc
    for key in path:
        value = value[key]
    return int(value)


def _labels(model: str, version: str) -> str:
    return f'{{model="{_escape(model)}",version="{_escape(version)}"}}'


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")

"""The one Prometheus text exposition (format 0.0.4) writer every ``/metrics`` part renders through.

Guarantees: every label value is escaped (backslash, double quote, newline), HELP text is escaped (backslash,
newline), label names and metric names are checked against Prometheus' grammar (a bad one is a programming
error, raised at once rather than served as a scrape that fails), and values are written without losing
precision (integers in full, floats by ``repr``, infinities and NaN by their exposition spelling).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Literal

Kind = Literal["counter", "gauge", "histogram", "summary", "untyped"]
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


class MetricFamily:
    """One metric's HELP and TYPE lines and its samples; ``suffix`` serves histograms (_bucket, _sum, _count)."""

    def __init__(self, name: str, kind: Kind, help_text: str) -> None:
        if not _NAME.match(name):
            raise ValueError(f"metric name {name!r} is not a valid Prometheus name")
        self.name = name
        self.kind = kind
        self.help_text = help_text
        self.samples: list[str] = []

    def add(self, value: float, labels: Mapping[str, str] | None = None, suffix: str = "") -> MetricFamily:
        self.samples.append(f"{self.name}{suffix}{_labels(labels)} {format_value(value)}")
        return self

    def lines(self) -> list[str]:
        return [f"# HELP {self.name} {escape_help(self.help_text)}", f"# TYPE {self.name} {self.kind}",
                *self.samples]


def _labels(labels: Mapping[str, str] | None) -> str:
    if not labels:
        return ""
    for key in labels:
        if not _LABEL.match(key):
            raise ValueError(f"label name {key!r} is not a valid Prometheus label name")
    return "{" + ",".join(f'{k}="{escape_label(str(v))}"' for k, v in labels.items()) + "}"


def render(families: Iterable[MetricFamily], *, skip_empty: bool = False) -> str:
    """The exposition text of ``families``, newline-terminated; ``skip_empty`` leaves out families with no
    samples (telemetry gauges of quantities this module does not have)."""
    lines = [line for f in families if f.samples or not skip_empty for line in f.lines()]
    return "\n".join(lines) + "\n" if lines else ""

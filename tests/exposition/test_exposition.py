"""The one Prometheus text writer: escaped labels and HELP, exact values, names checked; read back by the
reference parser (prometheus_client)."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from edged.exposition import MetricFamily, format_value, render


def test_awkward_label_values_survive_a_round_trip_through_the_reference_parser() -> None:
    awkward = 'VDD "IN" \\ rail\nsecond line'
    text = render([MetricFamily("edged_power_milliwatts", "gauge", "Power per rail.\nIn mW \\ really.")
                   .add(5263, {"rail": awkward}).add(12.5, {"rail": "plain"})])
    (family,) = text_string_to_metric_families(text)
    assert family.name == "edged_power_milliwatts" and family.type == "gauge"
    assert family.documentation == "Power per rail.\nIn mW \\ really."
    assert [(s.labels["rail"], s.value) for s in family.samples] == [(awkward, 5263.0), ("plain", 12.5)]


def test_values_keep_their_precision() -> None:
    assert format_value(2638 * 1024 * 1024) == "2766143488"
    assert format_value(2766143488.0) == "2766143488"
    assert format_value(0.1 + 0.2) == repr(0.1 + 0.2)
    assert format_value(True) == "1"
    assert (format_value(math.inf), format_value(-math.inf), format_value(math.nan)) == ("+Inf", "-Inf", "NaN")


def test_bad_names_are_refused_at_once() -> None:
    with pytest.raises(ValueError, match="metric name"):
        MetricFamily("edged-bad", "gauge", "x")
    with pytest.raises(ValueError, match="label name"):
        MetricFamily("edged_ok", "gauge", "x").add(1, {"bad-label": "v"})


def test_empty_families_are_kept_or_skipped_on_request() -> None:
    empty = MetricFamily("edged_nothing", "counter", "No samples yet.")
    assert render([empty]) == "# HELP edged_nothing No samples yet.\n# TYPE edged_nothing counter\n"
    assert render([empty], skip_empty=True) == ""

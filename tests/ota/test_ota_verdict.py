"""The watch window's verdict from the engine's numbers: error rate at once, p99 only over enough requests."""

from __future__ import annotations

from edged.ota._watch import P99_MIN_REQUESTS, Health, verdict

LIMITS = {"max_error_rate": 0.01, "max_p99_ratio": 2.0, "min_requests": 10}


def test_a_p99_regression_over_enough_requests_fails_at_the_end_of_the_window() -> None:
    slow = Health(P99_MIN_REQUESTS, 0, 0.05)
    assert verdict(slow, 0.01, window_over=False, **LIMITS)[0] == "wait"
    outcome, reason = verdict(slow, 0.01, window_over=True, **LIMITS)
    assert outcome == "fail" and "p99 latency 50.0 ms is more than max_p99_ratio 2" in reason


def test_a_p99_over_a_handful_of_requests_condemns_nothing() -> None:
    outcome, reason = verdict(Health(12, 0, 0.05), 0.01, window_over=True, **LIMITS)
    assert outcome == "pass" and "too few to judge p99" in reason


def test_errors_fail_before_the_window_ends_and_low_traffic_relies_on_the_vectors() -> None:
    assert verdict(Health(10, 2, 0.001), 0.001, window_over=False, **LIMITS)[0] == "fail"
    outcome, reason = verdict(Health(3, 0, 0.001), 0.001, window_over=True, **LIMITS)
    assert outcome == "pass" and "confirmed by its test vectors alone" in reason

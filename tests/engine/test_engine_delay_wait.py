"""The estimate of how late a timed sleep ends (edged.engine.delay_wait), fed recorded-style lateness values:
it starts at zero, follows the wake-ups it sees, and one stall of a loaded machine cannot set it alone."""

from __future__ import annotations

import pytest

from edged.engine.delay_wait import SPIN_MAX_NS, Lateness


def test_lateness_starts_at_zero_follows_late_wakeups_and_is_bounded() -> None:
    lateness = Lateness()
    assert lateness.spin_ns == 0  # nothing seen: sleep up to the deadline
    for _ in range(100):
        lateness.observe(80_000)
    assert 110_000 <= lateness.spin_ns <= 120_000  # awake for 1.5 times the usual lateness before the end
    for _ in range(100):
        lateness.observe(-5_000)  # an early end is an end on time
    assert lateness.spin_ns == pytest.approx(0, abs=100)


def test_one_stall_of_a_loaded_machine_does_not_set_the_spin_alone() -> None:
    lateness = Lateness()
    lateness.observe(50_000_000)  # a 50 ms stall
    assert lateness.spin_ns <= SPIN_MAX_NS // 8 * 3 // 2 + 1
    for _ in range(200):
        lateness.observe(10_000_000)
    assert lateness.spin_ns == SPIN_MAX_NS

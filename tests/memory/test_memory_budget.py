"""Admission control: what fits, what is evicted (LRU, never busy), what is refused, and why."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edged.config import MemoryConfig
from edged.errors import MemoryBudgetExceeded
from edged.memory import EvictionCandidate, MemoryBudget

MIB = 1024 * 1024


def budget(limit_mb: float = 100, policy: str = "evict_lru") -> MemoryBudget:
    return MemoryBudget(MemoryConfig(budget_mb=limit_mb, policy=policy), total_memory_bytes=8 * 1024 * MIB)  # type: ignore[arg-type]


def loaded(budget_: MemoryBudget, **models_mb: int) -> None:
    for key, mb in models_mb.items():
        assert budget_.admit(key, mb * MIB, list) == []
        budget_.commit(key, mb * MIB)


def test_a_model_that_fits_evicts_nothing_and_is_charged() -> None:
    b = budget()
    assert b.admit("a/1", 40 * MIB, list) == []
    assert b.used_bytes == 40 * MIB


def test_no_budget_admits_everything() -> None:
    b = MemoryBudget(MemoryConfig(), total_memory_bytes=MIB)
    assert b.limit_bytes is None
    assert b.admit("huge/1", 10**12, list) == []


def test_budget_percent_is_a_share_of_total_memory() -> None:
    b = MemoryBudget(MemoryConfig(budget_percent=25), total_memory_bytes=8000 * MIB)
    assert b.limit_bytes == 2000 * MIB


def test_lru_idle_models_are_evicted_first_and_busy_ones_never() -> None:
    b = budget()
    loaded(b, a=30, b=30, c=30)
    candidates = [EvictionCandidate("a", last_used=1.0, in_flight=2), EvictionCandidate("b", 3.0, 0),
                  EvictionCandidate("c", 2.0, 0)]
    assert b.admit("d", 50 * MIB, lambda: candidates) == ["c", "b"]


def test_refuse_policy_names_budget_usage_and_need() -> None:
    b = budget(policy="refuse")
    loaded(b, a=80)
    with pytest.raises(MemoryBudgetExceeded) as caught:
        b.admit("big/2", 30 * MIB, lambda: [EvictionCandidate("a", 0.0, 0)])
    message = str(caught.value)
    for part in ("big/2", "30.0 MiB", "100.0 MiB", "80.0 MiB is in use", "a 80.0 MiB", "refuse"):
        assert part in message


def test_busy_models_that_block_a_load_are_named() -> None:
    b = budget()
    loaded(b, a=60, b=30)
    candidates = [EvictionCandidate("a", 0.0, 1), EvictionCandidate("b", 1.0, 0)]
    with pytest.raises(MemoryBudgetExceeded, match="a have requests in flight"):
        b.admit("c", 50 * MIB, lambda: candidates)
    assert b.charges() == {"a": 60 * MIB, "b": 30 * MIB}


def test_a_model_bigger_than_the_whole_budget_is_refused_without_evicting() -> None:
    b = budget()
    loaded(b, a=10)
    with pytest.raises(MemoryBudgetExceeded, match="alone exceeds"):
        b.admit("x", 101 * MIB, lambda: [EvictionCandidate("a", 0.0, 0)])


def test_the_charge_is_the_measured_footprint_and_the_next_estimate_the_measured_peak() -> None:
    b = budget()
    assert b.estimate("a@file", file_bytes=10 * MIB) == 55 * MIB  # glibc's default peak factor 5.5
    b.admit("a", b.estimate("a@file", 10 * MIB), list)
    assert b.used_bytes == 55 * MIB  # while loading, the expected peak is reserved
    b.commit("a", 12 * MIB)
    b.remember_peak("a@file", 20 * MIB)
    assert b.used_bytes == 12 * MIB
    assert b.free_bytes == 88 * MIB
    b.release("a")
    assert b.used_bytes == 0
    assert b.estimate("a@file", file_bytes=10 * MIB) == 20 * MIB


def test_the_estimate_scales_with_the_instances_the_load_creates() -> None:
    b = budget()
    # the factor is a load of two instances' (ONNX Runtime's default); each one past them adds its share
    assert b.estimate("a@file", 10 * MIB, instances=1) == b.estimate("a@file", 10 * MIB, instances=2) == 55 * MIB
    assert b.estimate("a@file", 10 * MIB, instances=8) == 4 * 55 * MIB
    # a tiny file's instances cost at least their session each (3000 sessions of a 10 KB model: +420 MiB)
    assert b.estimate("t@file", 10_000, instances=3000) >= 3000 * 128 * 1024


def test_a_peak_measured_with_n_instances_is_scaled_to_the_m_of_the_next_load() -> None:
    b = budget()
    b.remember_peak("a@file", 20 * MIB, instances=2)
    assert b.estimate("a@file", 10 * MIB, instances=2) == 20 * MIB
    assert b.estimate("a@file", 10 * MIB, instances=1) == 10 * MIB
    assert b.estimate("a@file", 10 * MIB, instances=3000) == 30_000 * MIB


def test_the_default_peak_factor_follows_the_allocator_and_a_configured_one_wins() -> None:
    config = MemoryConfig(budget_mb=100)
    assert MemoryBudget(config, 0, "jemalloc").estimate("f", 10 * MIB) == 35 * MIB
    assert MemoryBudget(config, 0, "tcmalloc").estimate("f", 10 * MIB) == 35 * MIB
    assert MemoryBudget(MemoryConfig(load_estimate_factor=2.0), 0, "system").estimate("f", 10 * MIB) == 20 * MIB


def test_a_renamed_charge_keeps_its_bytes() -> None:
    b = budget()
    loaded(b, **{"a/1 (reload)": 30})
    b.rename("a/1 (reload)", "a/1")
    assert b.charges() == {"a/1": 30 * MIB}


def test_a_failed_admission_keeps_the_previous_charge_of_a_reload() -> None:
    b = budget(policy="refuse")
    loaded(b, a=50, b=40)
    with pytest.raises(MemoryBudgetExceeded):
        b.admit("a", 70 * MIB, list)
    assert b.charges()["a"] == 50 * MIB


sizes = st.integers(min_value=1, max_value=60)


@given(st.lists(st.tuples(sizes, st.floats(0, 100), st.integers(0, 2)), min_size=1, max_size=8), sizes)
def test_eviction_fits_the_budget_in_lru_order_and_spares_busy_models(
        models: list[tuple[int, float, int]], need: int) -> None:
    b = MemoryBudget(MemoryConfig(budget_mb=200, policy="evict_lru"), total_memory_bytes=0)
    candidates = []
    for i, (mb, last_used, in_flight) in enumerate(models):
        b.commit(f"m{i}", mb * MIB)
        candidates.append(EvictionCandidate(f"m{i}", last_used, in_flight))
    before = b.charges()
    try:
        victims = b.admit("new", need * MIB, lambda: candidates)
    except MemoryBudgetExceeded:
        idle = sum(before[c.key] for c in candidates if c.in_flight == 0)
        assert sum(before.values()) - idle + need * MIB > 200 * MIB
        return
    by_key = {c.key: c for c in candidates}
    assert all(by_key[v].in_flight == 0 for v in victims)
    assert [by_key[v].last_used for v in victims] == sorted(by_key[v].last_used for v in victims)
    assert sum(before.values()) - sum(before[v] for v in victims) + need * MIB <= 200 * MIB

"""Triton's queue policies through the real engine on a real onnxruntime model: priority levels, per-level
policies, timeout_action DELAY and REJECT, expiry anywhere in a queue, preserve_ordering, bounded inline work.

The model's only instance is held by a request whose completion callback blocks (the callback runs on the
executing thread), so the queue behind it is built deterministically before anything runs.
"""

from __future__ import annotations

import ctypes
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from modelgen import add_model, mlp_weights

from edged.config import ModelsConfig
from edged.engine import InferenceService, InferRequest, InferResponse
from edged.engine.scheduler import INLINE_MAX_BATCHES
from edged.engine.worker_pool import WORKER_TIMER_SLACK_NS
from edged.errors import EdgedError, QueueFull, RequestTimeout

WEIGHTS = mlp_weights(in_dim=4, hidden=8, out_dim=2)
X = np.ones((1, 4), np.float32)
# Long enough for a 1 ms queue timeout to have passed for certain while the instance is held.
PAST_A_1MS_TIMEOUT_S = 0.05


def serve(tmp_path: Path, batching: str, max_batch: int = 1) -> InferenceService:
    config = (f'name: "m"\nbackend: "onnxruntime"\nmax_batch_size: {max_batch}\n'
              'input [ { name: "input", data_type: TYPE_FP32, dims: [ 4 ] } ]\n'
              'output [ { name: "output", data_type: TYPE_FP32, dims: [ 2 ] } ]\n'
              'instance_group [ { count: 1, kind: KIND_CPU } ]\n'  # one instance: the hold holds it all
              f"dynamic_batching {{ {batching} }}\n")
    add_model(tmp_path, "m", config, {1: WEIGHTS})
    service = InferenceService(tmp_path, ModelsConfig(warmup=False))
    service.start()
    assert service.ready
    return service


class Hold:
    """Holds the model's instance until `release`: a request whose completion callback blocks."""

    def __init__(self, service: InferenceService) -> None:
        self._release = threading.Event()
        for _ in range(50):
            # under a 1 ms queue timeout the holding request itself may be refused before a worker takes it (the
            # model's expiry refuses it on time): submit it again until it runs
            self._started = threading.Event()
            self._ran = False
            service.submit(InferRequest("m", {"input": X}), self._block, inline=False)
            assert self._started.wait(10), "the holding request never ran"
            if self._ran:
                return
        raise AssertionError("the holding request timed out in the queue 50 times")

    def _block(self, result: InferResponse | EdgedError) -> None:
        self._ran = isinstance(result, InferResponse)
        self._started.set()
        if self._ran:
            self._release.wait(30)

    def release(self) -> None:
        self._release.set()


class Outcomes:
    """Results by tag, in the order their callbacks ran."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.results: dict[str, InferResponse | EdgedError] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    def submit(self, service: InferenceService, tag: str, priority: int = 0, timeout_us: int = 0,
               inline: bool = False) -> None:
        def done(result: InferResponse | EdgedError) -> None:
            with self._lock:
                self.order.append(tag)
                self.results[tag] = result
                self._changed.notify_all()
        service.submit(InferRequest("m", {"input": X}, priority=priority, timeout_us=timeout_us, id=tag), done,
                       inline=inline)

    def wait(self, count: int) -> None:
        with self._lock:
            assert self._changed.wait_for(lambda: len(self.order) >= count, 30), self.order


def test_levels_run_most_urgent_first_and_an_unknown_priority_gets_the_default_level(tmp_path: Path) -> None:
    service = serve(tmp_path, "priority_levels: 3 default_priority_level: 2")
    try:
        hold, outcomes = Hold(service), Outcomes()
        for tag, priority in (("a", 3), ("b", 1), ("c", 0), ("d", 9), ("e", 2)):
            outcomes.submit(service, tag, priority)
        hold.release()
        outcomes.wait(5)
        assert outcomes.order == ["b", "c", "d", "e", "a"]  # 0 and 9 (> priority_levels) mean level 2, as in Triton
    finally:
        service.close()


@pytest.mark.parametrize("action", ["DELAY", "REJECT"])
def test_a_timed_out_request_is_delayed_behind_its_level_or_rejected(tmp_path: Path, action: str) -> None:
    service = serve(tmp_path, f"default_queue_policy {{ timeout_action: {action} "
                              "default_timeout_microseconds: 30000000 allow_timeout_override: true }")
    try:
        hold, outcomes = Hold(service), Outcomes()
        outcomes.submit(service, "late", timeout_us=1000)  # overrides the 30 s default with 1 ms
        outcomes.submit(service, "on_time")
        threading.Event().wait(PAST_A_1MS_TIMEOUT_S)
        hold.release()
        outcomes.wait(2)
        assert isinstance(outcomes.results["on_time"], InferResponse)
        if action == "DELAY":
            assert outcomes.order == ["on_time", "late"]
            assert isinstance(outcomes.results["late"], InferResponse)
        else:
            assert isinstance(outcomes.results["late"], RequestTimeout)
    finally:
        service.close()


def test_a_request_override_may_shorten_the_default_timeout_but_never_lengthen_it(tmp_path: Path) -> None:
    service = serve(tmp_path, "default_queue_policy { default_timeout_microseconds: 1000 "
                              "allow_timeout_override: true }")
    try:
        hold, outcomes = Hold(service), Outcomes()
        outcomes.submit(service, "asks_for_30s", timeout_us=30_000_000)
        threading.Event().wait(PAST_A_1MS_TIMEOUT_S)
        hold.release()
        outcomes.wait(1)
        assert isinstance(outcomes.results["asks_for_30s"], RequestTimeout)
    finally:
        service.close()


def test_a_request_without_a_deadline_does_not_shield_an_expired_one_behind_it(tmp_path: Path) -> None:
    service = serve(tmp_path, "", max_batch=8)
    try:
        hold, outcomes = Hold(service), Outcomes()
        outcomes.submit(service, "patient")
        outcomes.submit(service, "hurried", timeout_us=1000)
        threading.Event().wait(PAST_A_1MS_TIMEOUT_S)
        hold.release()
        outcomes.wait(2)
        assert isinstance(outcomes.results["patient"], InferResponse)
        assert isinstance(outcomes.results["hurried"], RequestTimeout)
    finally:
        service.close()


def test_each_priority_level_has_its_own_queue_policy(tmp_path: Path) -> None:
    service = serve(tmp_path, "priority_levels: 2 default_priority_level: 2\n"
                              "priority_queue_policy { key: 1 value: { max_queue_size: 1 } }\n"
                              "priority_queue_policy { key: 2 value: { default_timeout_microseconds: 1000 } }")
    try:
        hold, outcomes = Hold(service), Outcomes()
        outcomes.submit(service, "urgent", priority=1)
        outcomes.submit(service, "urgent_overflow", priority=1)
        outcomes.submit(service, "routine", priority=2)
        assert isinstance(outcomes.results["urgent_overflow"], QueueFull)  # refused at once: level 1 holds one
        assert "priority level 1" in str(outcomes.results["urgent_overflow"])
        threading.Event().wait(PAST_A_1MS_TIMEOUT_S)
        hold.release()
        outcomes.wait(3)
        assert isinstance(outcomes.results["urgent"], InferResponse)
        assert isinstance(outcomes.results["routine"], RequestTimeout)  # level 2's 1 ms timeout
    finally:
        service.close()


@pytest.mark.parametrize("preserve", [True, False])
def test_preserve_ordering_answers_in_queueing_order_though_priority_ran_another_first(tmp_path: Path,
                                                                                      preserve: bool) -> None:
    service = serve(tmp_path, f"priority_levels: 2 default_priority_level: 2 "
                              f"preserve_ordering: {str(preserve).lower()}")
    try:
        hold, outcomes = Hold(service), Outcomes()
        outcomes.submit(service, "routine", priority=2)
        outcomes.submit(service, "urgent", priority=1)
        hold.release()
        outcomes.wait(2)
        assert outcomes.order == (["routine", "urgent"] if preserve else ["urgent", "routine"])
        assert all(isinstance(result, InferResponse) for result in outcomes.results.values())
    finally:
        service.close()


def test_the_highest_priority_level_triton_allows_is_served(tmp_path: Path) -> None:
    service = serve(tmp_path, "priority_levels: 18446744073709551615 default_priority_level: 4294967295\n"
                              "priority_queue_policy { key: 4294967296 value: { max_queue_size: 10 } }")
    try:
        hold, outcomes = Hold(service), Outcomes()
        outcomes.submit(service, "default")
        outcomes.submit(service, "top", priority=1)
        outcomes.submit(service, "bottom", priority=2**64 - 1)
        hold.release()
        outcomes.wait(3)
        assert outcomes.order == ["top", "default", "bottom"]
    finally:
        service.close()


def test_an_inline_caller_overtaken_by_a_flood_of_urgent_work_runs_a_bounded_number_of_batches(
        tmp_path: Path) -> None:
    service = serve(tmp_path, "priority_levels: 2 default_priority_level: 2")
    flood_size = 300
    ran_on: list[int] = []  # the thread each urgent request ran on (its callback runs where it executed)
    finished = threading.Semaphore(0)

    def urgent(result: InferResponse | EdgedError) -> None:
        ran_on.append(threading.get_ident())
        if len(ran_on) < flood_size:  # each completion queues the next: urgent work never runs out
            service.submit(InferRequest("m", {"input": X}, priority=1), urgent, inline=False)
        else:
            finished.release()

    try:
        own: list[InferResponse | EdgedError] = []
        calls = [(InferRequest("m", {"input": X}, priority=1), urgent),
                 (InferRequest("m", {"input": X}, priority=2), own.append)]
        service.submit_many("m", "", calls, inline=True)  # the caller takes the idle instance and runs inline
        ran_inline = ran_on.count(threading.get_ident())
        assert 1 <= ran_inline <= INLINE_MAX_BATCHES
        assert finished.acquire(timeout=60)
        service.close()  # the caller's own request, overtaken, finished on a worker
        assert len(own) == 1 and isinstance(own[0], InferResponse)
    finally:
        service.close()


def test_a_worker_waiting_out_a_batching_delay_asks_for_precise_timers(tmp_path: Path) -> None:
    service = serve(tmp_path, "max_queue_delay_microseconds: 100", max_batch=8)
    libc = ctypes.CDLL(None, use_errno=True)
    slack: list[int] = []
    try:
        outcomes = Outcomes()
        # A callback runs on the thread that executed: with a queue delay and no traffic seen yet, a worker (a
        # lone request's caller that waits the delay out itself sets its own: tests/engine/test_engine_caller_wait.py)
        service.submit(InferRequest("m", {"input": X}), lambda result: slack.append(libc.prctl(30, 0, 0, 0, 0)),
                       inline=True)
        outcomes.submit(service, "after", inline=False)
        outcomes.wait(1)
        assert slack == [WORKER_TIMER_SLACK_NS]  # PR_GET_TIMERSLACK; Linux's default would be 50000
        assert libc.prctl(30, 0, 0, 0, 0) != WORKER_TIMER_SLACK_NS  # a caller that did not wait is left alone
    finally:
        service.close()


def test_levels_without_their_own_policy_share_the_default_queue_bound(tmp_path: Path) -> None:
    service = serve(tmp_path, "priority_levels: 18446744073709551615 default_priority_level: 1\n"
                              "default_queue_policy { max_queue_size: 2 }\n"
                              "priority_queue_policy { key: 3 value: { max_queue_size: 1 } }")
    try:
        hold, outcomes = Hold(service), Outcomes()
        for tag, priority in (("p5", 5), ("p6", 6), ("p7", 7), ("p3", 3), ("p3_again", 3)):
            outcomes.submit(service, tag, priority)
        assert isinstance(outcomes.results["p7"], QueueFull)  # levels 5, 6, 7 share default's 2
        # the refusal says so: "2 requests waiting at priority level 7" would be false (none waits there)
        assert "without their own priority_queue_policy, level 7" in str(outcomes.results["p7"])
        assert "default_queue_policy's max_queue_size" in str(outcomes.results["p7"])
        assert isinstance(outcomes.results["p3_again"], QueueFull)  # level 3's own bound of 1
        assert "waiting at priority level 3)" in str(outcomes.results["p3_again"])
        hold.release()
        outcomes.wait(5)
        assert outcomes.order == ["p7", "p3_again", "p3", "p5", "p6"]
        assert all(isinstance(outcomes.results[tag], InferResponse) for tag in ("p3", "p5", "p6"))
    finally:
        service.close()


def test_a_timeout_shorter_than_the_batching_delay_is_refused_at_the_timeout_not_the_delays_end(
        tmp_path: Path) -> None:
    service = serve(tmp_path, "max_queue_delay_microseconds: 400000 default_queue_policy { allow_timeout_override: "
                    "true }", max_batch=8)
    try:
        outcomes = Outcomes()
        started = time.monotonic()
        outcomes.submit(service, "short", timeout_us=1000)
        outcomes.submit(service, "patient")  # waits the delay out and runs
        outcomes.wait(1)
        refused_after_s = time.monotonic() - started
        assert outcomes.order[0] == "short" and isinstance(outcomes.results["short"], RequestTimeout)
        assert refused_after_s < 0.2, f"refused after {refused_after_s:.3f} s: at the 0.4 s delay's end"
        outcomes.wait(2)
        assert isinstance(outcomes.results["patient"], InferResponse)
    finally:
        service.close()

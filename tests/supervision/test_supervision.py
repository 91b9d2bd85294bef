"""The health board and the supervised thread runner: restart with backoff, counted, degraded until healthy."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest

from edged.daemon._health import supervised_task
from edged.supervision import HealthBoard, SupervisedPool, SupervisedThread, backoff_s

WAIT_S = 20.0


def test_a_failing_work_restarts_counted_and_stays_degraded_until_it_reports_ok() -> None:
    board = HealthBoard(wall=lambda: 1234.5)
    component = board.component("worker")
    runs: list[int] = []
    recovered, release = threading.Event(), threading.Event()

    def work() -> None:
        runs.append(len(runs))
        if len(runs) <= 2:
            raise OSError(24, "Too many open files")
        component.ok()
        recovered.set()
        release.wait(WAIT_S)

    thread = SupervisedThread("worker", work, component, backoff_min_s=0.001, backoff_max_s=0.002)
    thread.start()
    assert recovered.wait(WAIT_S)
    health = component.health
    assert (health.state, health.restarts, health.errors) == ("ok", 2, 2)
    assert health.last_error == "OSError: [Errno 24] Too many open files" and health.last_error_at == 1234.5
    assert board.overall() == ("ok", "")
    release.set()
    thread.join(WAIT_S)
    assert not thread.is_alive() and len(runs) == 3  # a clean return ends it: no restart


def test_degraded_with_the_reason_while_restarting_and_stop_during_backoff_ends_it() -> None:
    board = HealthBoard()
    component = board.component("outbox")
    failed = threading.Event()

    def work() -> None:
        failed.set()
        raise RuntimeError("disk I/O error")

    thread = SupervisedThread("outbox", work, component, backoff_min_s=30.0, backoff_max_s=60.0)
    thread.start()
    assert failed.wait(WAIT_S)
    thread.stop()  # during the 30 s backoff: ends at once, never restarted
    thread.join(WAIT_S)
    assert not thread.is_alive()
    state, reason = board.overall()
    assert state == "degraded" and reason == "outbox degraded: RuntimeError: disk I/O error"
    assert component.health.restarts == 0 and component.health.errors == 1


def test_listeners_hear_state_changes_only() -> None:
    board = HealthBoard()
    heard: list[tuple[str, str]] = []
    board.add_listener(lambda: heard.append(board.overall()))
    component = board.component("sampler")
    component.ok()  # already ok: no change
    component.degraded("source ended")
    component.degraded("source ended")  # same reason: no change
    component.error(ValueError("bad"))
    component.ok()
    assert heard == [("degraded", "sampler degraded: source ended"),
                     ("degraded", "sampler degraded: ValueError: bad"), ("ok", "")]


def test_a_failing_listener_does_not_break_the_component() -> None:
    board = HealthBoard()
    board.add_listener(lambda: 1 / 0)
    component = board.component("x")
    component.degraded("why")
    assert component.health.state == "degraded"


def test_backoff_grows_exponentially_with_full_jitter_and_is_capped() -> None:
    rng = random.Random(7)
    delays = [backoff_s(attempt, 0.5, 8.0, rng) for attempt in range(12)]
    assert all(0.5 <= d <= 8.0 for d in delays)
    assert all(d <= 0.5 * 2 ** a for a, d in enumerate(delays))
    with pytest.raises(ValueError, match="backoff"):
        SupervisedThread("bad", lambda: None, HealthBoard().component("bad"), backoff_min_s=0.0)


def test_a_supervised_event_loop_task_restarts_after_an_exception() -> None:
    board = HealthBoard()
    component = board.component("memory_pressure")
    runs: list[int] = []

    async def work() -> None:
        runs.append(1)
        if len(runs) == 1:
            raise OSError(24, "Too many open files", "/proc/meminfo")
        component.ok()

    asyncio.run(asyncio.wait_for(supervised_task(component, work, backoff_min_s=0.001, backoff_max_s=0.002),
                                 WAIT_S))
    assert len(runs) == 2
    assert (component.health.state, component.health.restarts, component.health.errors) == ("ok", 1, 1)


def test_cancelling_a_supervised_task_ends_it() -> None:
    component = HealthBoard().component("poll")

    async def forever() -> None:
        await asyncio.sleep(3600)

    async def run() -> None:
        task = asyncio.ensure_future(supervised_task(component, forever))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert component.health.restarts == 0 and component.health.state == "ok"


def test_a_pool_runs_its_workers_under_their_names_and_stop_waits_for_them() -> None:
    board = HealthBoard()
    release = threading.Event()
    names: list[str] = []
    lock = threading.Lock()

    def work() -> None:
        with lock:
            names.append(threading.current_thread().name)
        release.wait(30)  # the owner's signal to return, as a closed queue is for the MQTT workers

    pool = SupervisedPool("edged-test-worker", 3, work, board.component("test_pool"))
    pool.start()
    deadline = threading.Event()
    for _ in range(300):
        with lock:
            if len(names) == 3:
                break
        deadline.wait(0.01)
    assert sorted(names) == ["edged-test-worker-0", "edged-test-worker-1", "edged-test-worker-2"]
    release.set()
    pool.stop(10)
    assert not any(t.is_alive() for t in threading.enumerate() if t.name.startswith("edged-test-worker"))

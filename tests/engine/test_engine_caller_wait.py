"""Who waits out a short batching delay: a lone request's own caller, when it may run the model (inline), once
the model's traffic is solo (SOLO_EVIDENCE batches in a row that a worker ran alone); a worker otherwise (a
longer delay, a front end holding requests it has read, a caller that must not block, the first requests after a
batch, and every CALLER_PROBE_EVERY-th lone request: the probe, since a caller's own batch of one proves
nothing). Through the real engine and scheduler with the doubling test backend, which records each execution's
batch size; the thread a completion callback runs on is the thread that executed the batch."""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import engine_fakes
import numpy as np
from engine_fakes import scheduler_of

from edged.engine import InferenceService, InferRequest, InferResponse
from edged.engine.scheduler import Scheduler
from edged.engine.worker_pool import CALLER_DELAY_MAX_NS, CALLER_PROBE_EVERY, SOLO_EVIDENCE, WORKER_TIMER_SLACK_NS
from edged.errors import EdgedError

X = np.ones((1, 4), np.float32)
SHORT_DELAY_US = 200
_PR_GET_TIMERSLACK = 30


def serve(tmp_path: Path, delay_us: int = SHORT_DELAY_US) -> InferenceService:
    return engine_fakes.delayed_service(tmp_path, delay_us)


class Run:
    """One request submitted from a fresh thread: which thread executed it, and that thread's timer slack."""

    def __init__(self, service: InferenceService, inline: bool = True) -> None:
        self.result: InferResponse | EdgedError | None = None
        self.ran_on = 0
        self.slack = 0
        self.caller = 0
        self.finished = threading.Event()
        self.returned_done = False  # the result was in when submit returned
        libc = ctypes.CDLL(None, use_errno=True)

        def done(result: InferResponse | EdgedError) -> None:
            self.result, self.ran_on = result, threading.get_ident()
            self.finished.set()

        def submit() -> None:
            self.caller = threading.get_ident()
            service.submit(InferRequest("m", {"input": X}), done, inline=inline)
            self.returned_done = self.finished.is_set()
            self.slack = libc.prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)

        thread = threading.Thread(target=submit)
        thread.start()
        thread.join(30)
        assert self.finished.wait(30)
        assert isinstance(self.result, InferResponse), self.result
        settle(scheduler_of(service))

    @property
    def by_caller(self) -> bool:
        return self.ran_on == self.caller


def settle(scheduler: Scheduler) -> None:
    """Wait until nothing is queued or executing (a worker's bookkeeping ends after the callback)."""
    for _ in range(30_000):
        if not scheduler.in_flight and not scheduler.delaying:
            return
        threading.Event().wait(0.001)
    raise AssertionError("the scheduler never settled")


def test_a_lone_request_after_solo_traffic_is_run_by_its_caller_once_the_delay_is_over(tmp_path: Path) -> None:
    service = serve(tmp_path)
    try:
        first = [Run(service) for _ in range(SOLO_EVIDENCE)]
        assert not any(run.by_caller for run in first)  # too little seen yet: a burst may be beginning
        wakeups = scheduler_of(service).wakeups
        later = [Run(service) for _ in range(3)]
        assert all(run.by_caller and run.returned_done for run in later)
        assert scheduler_of(service).wakeups == wakeups  # no worker was woken for them
        assert all(run.slack == WORKER_TIMER_SLACK_NS for run in later)  # the thread that waited asks for it
        assert engine_fakes.CONCURRENCY["batches"] == [1] * (SOLO_EVIDENCE + 3)
        stats = service.statistics("m")["model_stats"][0]
        assert (stats["inference_count"], stats["execution_count"]) == (SOLO_EVIDENCE + 3,) * 2
        assert stats["inference_stats"]["success"]["count"] == SOLO_EVIDENCE + 3
    finally:
        service.close()


def test_a_delay_longer_than_a_caller_may_wait_is_waited_out_by_a_worker(tmp_path: Path) -> None:
    service = serve(tmp_path, CALLER_DELAY_MAX_NS // 1000 + 1)
    try:
        runs = [Run(service) for _ in range(3)]
        assert not any(run.by_caller for run in runs)
        assert engine_fakes.CONCURRENCY["batches"] == [1, 1, 1]
    finally:
        service.close()


def test_a_caller_that_must_not_block_leaves_a_lone_request_to_a_worker(tmp_path: Path) -> None:
    service = serve(tmp_path)
    try:
        runs = [Run(service, inline=False) for _ in range(3)]
        assert not any(run.by_caller for run in runs)
    finally:
        service.close()


def solo_traffic(service: InferenceService) -> None:
    """Lone requests until the next one is its caller's."""
    for _ in range(SOLO_EVIDENCE):
        assert not Run(service).by_caller
    assert Run(service).by_caller


def test_every_so_many_lone_requests_one_is_waited_out_by_a_worker_with_the_caller_free(tmp_path: Path) -> None:
    """A caller waiting out the delay blocks its loop: requests arriving meanwhile stay unread and its batch runs
    alone whatever the traffic, so such batches prove nothing; the probe lets a worker wait, with the loop free."""
    service = serve(tmp_path)
    try:
        solo_traffic(service)  # the first of the caller's lone batches in a row
        runs = [Run(service) for _ in range(2 * CALLER_PROBE_EVERY)]
        by_caller = [run.by_caller for run in runs]
        probe = [True] * (CALLER_PROBE_EVERY - 2) + [False]
        assert by_caller == probe + [True] * (CALLER_PROBE_EVERY - 1) + [False] + [True], by_caller
    finally:
        service.close()


def test_a_lone_request_waits_on_a_worker_while_a_front_end_holds_requests_it_has_read(tmp_path: Path) -> None:
    service = serve(tmp_path)
    try:
        solo_traffic(service)
        service.intake.open()  # as the HTTP front end does while it parses a loop iteration's requests
        held = Run(service)
        service.intake.close()
        assert not held.by_caller  # the caller would block the loop that is reading the requests to join
    finally:
        service.close()


def test_after_a_batch_a_lone_request_goes_to_a_worker_so_a_beginning_burst_can_join_it(tmp_path: Path) -> None:
    service = serve(tmp_path)
    try:
        solo_traffic(service)
        results: list[InferResponse | EdgedError] = []
        service.submit_many("m", "", [(InferRequest("m", {"input": X}), results.append) for _ in range(3)])
        settle(scheduler_of(service))
        assert engine_fakes.CONCURRENCY["batches"][-1] == 3 and len(results) == 3
        # the last batch was not solo: the next requests may open a burst, until workers ran enough alone
        for _ in range(SOLO_EVIDENCE):
            assert not Run(service).by_caller
        assert Run(service).by_caller
    finally:
        service.close()


def test_sixteen_submitted_together_after_solo_traffic_still_form_one_batch(tmp_path: Path) -> None:
    service = serve(tmp_path)
    try:
        solo_traffic(service)  # the next lone request would be its caller's
        results: list[InferResponse | EdgedError] = []
        service.submit_many("m", "", [(InferRequest("m", {"input": X}), results.append) for _ in range(16)])
        settle(scheduler_of(service))
        assert engine_fakes.CONCURRENCY["batches"] == [1] * (SOLO_EVIDENCE + 1) + [16] and len(results) == 16
    finally:
        service.close()

"""Batch formation with a batching delay, through the real engine and scheduler (the doubling test backend
records each execution's batch size): requests submitted together form one full batch, a lone request runs
alone once its delay is over, and a batch whose delay ends while a front end is still reading requests (its
intake open, edged.engine.intake) waits for them, for at most the delay once more."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import engine_fakes
import numpy as np
from engine_fakes import scheduler_of

from edged.engine import InferenceService, InferRequest, InferResponse
from edged.engine.scheduler import Scheduler
from edged.errors import EdgedError


def serve(tmp_path: Path, delay_us: int) -> InferenceService:
    return engine_fakes.delayed_service(tmp_path, delay_us)


class Results:
    def __init__(self) -> None:
        self.values: list[InferResponse | EdgedError] = []
        self._changed = threading.Condition()

    def done(self, result: InferResponse | EdgedError) -> None:
        with self._changed:
            self.values.append(result)
            self._changed.notify_all()

    def submit(self, service: InferenceService, count: int) -> None:
        calls = [(InferRequest("m", {"input": np.full((1, 4), float(i), np.float32)}), self.done)
                 for i in range(count)]
        service.submit_many("m", "", calls, inline=True)

    def wait(self, count: int) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.values) >= count, 30), self.values
        assert all(isinstance(value, InferResponse) for value in self.values), self.values


def wait_for_hold(scheduler: Scheduler) -> None:
    for _ in range(30_000):
        if scheduler.holds:
            return
        threading.Event().wait(0.001)
    raise AssertionError("the worker never held its batch for the open intake")


def test_sixteen_requests_submitted_together_form_one_batch_of_sixteen(tmp_path: Path) -> None:
    service = serve(tmp_path, 10_000_000)  # a full batch runs at once: the 10 s delay is never waited out
    try:
        results = Results()
        results.submit(service, 16)
        results.wait(16)
        assert engine_fakes.CONCURRENCY["batches"] == [16]
    finally:
        service.close()


def test_sixteen_coroutines_awaiting_in_one_loop_turn_form_one_batch(tmp_path: Path) -> None:
    service = serve(tmp_path, 10_000_000)

    async def main() -> list[InferResponse]:
        return await asyncio.gather(*(service.infer_async(
            InferRequest("m", {"input": np.full((1, 4), float(i), np.float32)})) for i in range(16)))
    try:
        responses = asyncio.run(main())
        assert [float(r.outputs["output"][0, 0]) for r in responses] == [2.0 * i for i in range(16)]
        assert engine_fakes.CONCURRENCY["batches"] == [16]
    finally:
        service.close()


def test_submits_that_do_not_fill_the_batch_leave_the_worker_waiting_out_its_delay(tmp_path: Path) -> None:
    service = serve(tmp_path, 1_000_000)
    try:
        results = Results()
        scheduler = scheduler_of(service)
        results.submit(service, 1)
        for _ in range(30_000):
            if scheduler.delaying:
                break
            threading.Event().wait(0.001)
        assert scheduler.delaying == 1
        wakeups = scheduler.wakeups
        for _ in range(3):
            results.submit(service, 2)  # 7 of 16 rows: the delay's end is the worker's to see, no wake-up
        assert scheduler.wakeups == wakeups
        results.submit(service, 9)  # 16 rows: the batch is full, the worker is woken to run it now
        assert scheduler.wakeups == wakeups + 1
        results.wait(16)
        assert engine_fakes.CONCURRENCY["batches"] == [16]
    finally:
        service.close()


def test_a_lone_request_runs_alone_once_its_delay_is_over_and_is_never_held(tmp_path: Path) -> None:
    service = serve(tmp_path, 50_000)
    try:
        results = Results()
        results.submit(service, 1)
        results.wait(1)
        assert engine_fakes.CONCURRENCY["batches"] == [1]
        assert scheduler_of(service).holds == 0  # the intake was never open: no wait past the delay
    finally:
        service.close()


def test_a_batch_whose_delay_ends_while_requests_are_being_read_waits_for_them(tmp_path: Path) -> None:
    service = serve(tmp_path, 1_000_000)
    try:
        results = Results()
        service.intake.open()  # as the HTTP front end does while it parses a loop iteration's requests
        results.submit(service, 1)
        wait_for_hold(scheduler_of(service))  # the first request's delay is over, the intake still open
        results.submit(service, 15)
        service.intake.close()
        results.wait(16)
        assert engine_fakes.CONCURRENCY["batches"] == [16]  # without the hold: [1, 15]
    finally:
        service.close()


def test_coroutines_queued_before_a_delay_ends_join_the_batch_it_holds(tmp_path: Path) -> None:
    service = serve(tmp_path, 1_000_000)
    results = Results()

    async def main() -> list[InferResponse]:
        results.submit(service, 1)  # from a thread's API: its delay starts now
        tasks = [asyncio.ensure_future(service.infer_async(InferRequest(
            "m", {"input": np.full((1, 4), float(i), np.float32)}))) for i in range(15)]
        await asyncio.sleep(0)  # the tasks queue their requests; the loop turn's commit comes after this step
        wait_for_hold(scheduler_of(service))  # blocks the loop past the first request's delay, the commit pending
        return await asyncio.gather(*tasks)
    try:
        assert len(asyncio.run(main())) == 15
        results.wait(1)
        assert engine_fakes.CONCURRENCY["batches"] == [16]  # without the hold: [1, 15]
    finally:
        service.close()


def test_closing_the_intake_releases_a_held_partial_batch(tmp_path: Path) -> None:
    service = serve(tmp_path, 1_000_000)
    try:
        results = Results()
        service.intake.open()
        results.submit(service, 3)
        scheduler = scheduler_of(service)
        wait_for_hold(scheduler)
        wakeups = scheduler.wakeups
        service.intake.close()  # nothing more came: the close wakes the worker, the held batch runs as it is
        results.wait(3)
        assert engine_fakes.CONCURRENCY["batches"] == [3]
        assert scheduler.wakeups == wakeups + 1  # woken by the close, not left to wait out the hold
    finally:
        service.close()


def test_a_batch_is_held_for_the_requests_being_read_not_for_later_iterations(tmp_path: Path) -> None:
    service = serve(tmp_path, 1_000_000)
    try:
        results = Results()
        service.intake.open()
        results.submit(service, 3)
        scheduler = scheduler_of(service)
        wait_for_hold(scheduler)
        service.intake.close()
        service.intake.open()  # the loop's next iteration reads more: the batch held once runs now
        results.wait(3)
        assert engine_fakes.CONCURRENCY["batches"] == [3]
        assert scheduler.holds == 1
    finally:
        service.intake.close()
        service.close()


def test_an_intake_that_never_closes_holds_a_batch_for_at_most_the_delay_once_more(tmp_path: Path) -> None:
    service = serve(tmp_path, 100_000)
    try:
        results = Results()
        service.intake.open()  # a front end that never closes it (a bug there) must not stall the model
        results.submit(service, 2)
        results.wait(2)
        assert engine_fakes.CONCURRENCY["batches"] == [2]
        assert scheduler_of(service).holds >= 1
    finally:
        service.intake.close()
        service.close()

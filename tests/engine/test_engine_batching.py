"""Dynamic batching, queue limits, timeouts, instance counts and failure isolation, through the real engine
with a test backend (y = 2x) standing in for a runtime."""

from __future__ import annotations

import threading
from pathlib import Path

import engine_fakes
import numpy as np
import pytest
from modelgen import add_custom_model

from edged.engine import InferenceService, InferRequest
from edged.errors import EdgedError, InferenceFailed, QueueFull, RequestTimeout

start = engine_fakes.start_service
wait_until_running = engine_fakes.wait_until_running


def concurrent(service: InferenceService, model: str, values: list[float]) -> dict[float, object]:
    results: dict[float, object] = {}
    barrier = threading.Barrier(len(values))

    def call(value: float) -> None:
        barrier.wait()
        try:
            results[value] = service.infer(InferRequest(model, {"input": np.full((1, 4), value, np.float32)}))
        except EdgedError as e:
            results[value] = e

    threads = [threading.Thread(target=call, args=(v,)) for v in values]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def test_concurrent_requests_are_batched_and_each_gets_its_own_rows(tmp_path: Path) -> None:
    add_custom_model(tmp_path, "dbl", "doubling", 'dynamic_batching { }\nparameters { key: "delay_s" value: '
                     '{ string_value: "0.02" } }', max_batch=16)
    service = start(tmp_path)
    try:
        values = [float(v) for v in range(1, 13)]
        results = concurrent(service, "dbl", values)
        for value in values:
            np.testing.assert_array_equal(results[value].outputs["output"], np.full((1, 4), 2 * value))
        assert max(engine_fakes.CONCURRENCY["batches"]) > 1, "concurrent requests should share a batch"
        stats = service.statistics("dbl")["model_stats"][0]
        assert stats["inference_count"] == 12 and stats["execution_count"] < 12
    finally:
        service.close()


def test_without_dynamic_batching_every_request_runs_alone(tmp_path: Path) -> None:
    add_custom_model(tmp_path, "solo", "doubling", 'parameters { key: "delay_s" value: { string_value: "0.01" } }')
    service = start(tmp_path)
    try:
        concurrent(service, "solo", [1.0, 2.0, 3.0, 4.0])
        assert engine_fakes.CONCURRENCY["batches"] == [1, 1, 1, 1]
    finally:
        service.close()


def test_a_bad_request_fails_alone_not_its_batch(tmp_path: Path) -> None:
    add_custom_model(tmp_path, "picky", "doubling", 'dynamic_batching { }\nparameters [ { key: "fail_on" value: '
                     '{ string_value: "13" } }, { key: "delay_s" value: { string_value: "0.02" } } ]', max_batch=16)
    service = start(tmp_path)
    try:
        results = concurrent(service, "picky", [1.0, 2.0, 13.0, 4.0, 5.0, 6.0])
        assert isinstance(results[13.0], InferenceFailed)
        for value in (1.0, 2.0, 4.0, 5.0, 6.0):
            np.testing.assert_array_equal(results[value].outputs["output"], np.full((1, 4), 2 * value))
        fail = service.statistics("picky")["model_stats"][0]["inference_stats"]["fail"]["count"]
        assert fail == 1
    finally:
        service.close()


def test_a_full_queue_refuses_with_queue_full(tmp_path: Path) -> None:
    add_custom_model(tmp_path, "tight", "doubling",
                     'dynamic_batching { default_queue_policy { max_queue_size: 1 } }\n'
                     'parameters { key: "block_until_released" value: { string_value: "true" } }', max_batch=1)
    service = start(tmp_path)
    try:
        done = threading.Event()
        outcomes: list[object] = []
        service.submit(InferRequest("tight", {"input": np.ones((1, 4), np.float32)}),
                       lambda r: (outcomes.append(r), done.set()), inline=False)  # runs and blocks
        wait_until_running()
        service.submit(InferRequest("tight", {"input": np.ones((1, 4), np.float32)}), outcomes.append, inline=False)
        refused: list[object] = []
        service.submit(InferRequest("tight", {"input": np.ones((1, 4), np.float32)}), refused.append, inline=False)
        assert isinstance(refused[0], QueueFull) and "queue is full" in str(refused[0])
        engine_fakes.RELEASE.set()
        assert done.wait(10)
    finally:
        engine_fakes.RELEASE.set()
        service.close()


def test_a_request_waiting_past_its_timeout_fails_with_request_timeout(tmp_path: Path) -> None:
    add_custom_model(tmp_path, "slowq", "doubling",
                     'dynamic_batching { default_queue_policy { default_timeout_microseconds: 50000 } }\n'
                     'parameters { key: "block_until_released" value: { string_value: "true" } }', max_batch=1)
    service = start(tmp_path)
    try:
        first: list[object] = []
        service.submit(InferRequest("slowq", {"input": np.ones((1, 4), np.float32)}), first.append, inline=False)
        wait_until_running()
        waiting = threading.Event()
        second: list[object] = []
        service.submit(InferRequest("slowq", {"input": np.ones((1, 4), np.float32)}),
                       lambda r: (second.append(r), waiting.set()), inline=False)
        threading.Event().wait(0.1)  # let the 50 ms queue timeout pass while the first request holds the model
        engine_fakes.RELEASE.set()
        assert waiting.wait(10)
        assert isinstance(second[0], RequestTimeout)
    finally:
        engine_fakes.RELEASE.set()
        service.close()


def test_a_queued_request_is_refused_at_its_timeout_while_the_only_instance_stays_busy(tmp_path: Path) -> None:
    """A run that does not end (a wedged backend, a model that takes minutes): the requests queued behind it get
    RequestTimeout at their deadline, not when the instance comes free; before, they waited for the run."""
    add_custom_model(tmp_path, "slowq", "doubling",
                     'dynamic_batching { default_queue_policy { default_timeout_microseconds: 50000 '
                     'allow_timeout_override: true } }\n'
                     'parameters { key: "block_until_released" value: { string_value: "true" } }', max_batch=1)
    service = start(tmp_path)
    try:
        first: list[object] = []
        service.submit(InferRequest("slowq", {"input": np.ones((1, 4), np.float32)}), first.append, inline=False)
        wait_until_running()
        answered = [threading.Event(), threading.Event()]
        second: list[object] = []
        third: list[object] = []
        service.submit(InferRequest("slowq", {"input": np.ones((1, 4), np.float32)}),
                       lambda r: (second.append(r), answered[0].set()), inline=False)
        service.submit(InferRequest("slowq", {"input": np.ones((1, 4), np.float32)}, timeout_us=10_000),
                       lambda r: (third.append(r), answered[1].set()), inline=False)
        # RELEASE is never set here: the first run holds the only instance until the end of the test
        assert answered[0].wait(20) and answered[1].wait(20), "queued requests waited for the busy instance"
        assert isinstance(second[0], RequestTimeout) and isinstance(third[0], RequestTimeout)
        assert not first  # still running: the refusals did not wait for it
    finally:
        engine_fakes.RELEASE.set()
        service.close()


def test_instance_count_two_runs_two_executions_at_once(tmp_path: Path) -> None:
    add_custom_model(tmp_path, "pair", "doubling", 'instance_group [ { count: 2, kind: KIND_CPU } ]\n'
                     'parameters { key: "delay_s" value: { string_value: "0.1" } }')
    service = start(tmp_path)
    try:
        concurrent(service, "pair", [1.0, 2.0, 3.0, 4.0])
        assert engine_fakes.CONCURRENCY["max"] == 2
    finally:
        service.close()


def test_watchdog_sees_a_wedged_execution(tmp_path: Path) -> None:
    add_custom_model(tmp_path, "hang", "doubling",
                     'parameters { key: "block_until_released" value: { string_value: "true" } }')
    service = start(tmp_path)
    try:
        service.submit(InferRequest("hang", {"input": np.ones((1, 4), np.float32)}), lambda r: None, inline=False)
        wait_until_running()
        threading.Event().wait(0.05)
        assert service.stalled(0.01) == ["hang/1"]
        engine_fakes.RELEASE.set()
    finally:
        engine_fakes.RELEASE.set()
        service.close()
    assert service.stalled(0.01) == []


@pytest.mark.parametrize("inline", [True, False])
def test_unload_finishes_queued_requests_first(tmp_path: Path, inline: bool) -> None:
    add_custom_model(tmp_path, "drain", "doubling", 'parameters { key: "delay_s" value: { string_value: "0.01" } }')
    service = start(tmp_path)
    outcomes: list[object] = []
    threads = [threading.Thread(target=lambda: outcomes.append(
        service.infer(InferRequest("drain", {"input": np.ones((1, 4), np.float32)})))) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    service.close(timeout_s=5)
    assert len(outcomes) == 5

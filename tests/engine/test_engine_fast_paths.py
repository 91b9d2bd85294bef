"""The engine's per-request fast paths give the same answers as the general ones: the single-input validation,
the cached default version, the row-wise split of a batch, the per-batch latency histogram, and the request's
own copy of its input dict."""

from __future__ import annotations

import bisect
import shutil
import threading
from pathlib import Path

import engine_fakes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from modelgen import add_custom_model, add_model, mlp_reference, mlp_weights

from edged.config import ModelsConfig
from edged.engine import InferenceService, InferRequest, InferResponse
from edged.engine.stats import _FOLD_AT, VersionStats
from edged.engine.types import RequestedOutput
from edged.engine.validation import RequestValidator
from edged.errors import EdgedError, ModelNotFound, ModelNotReady, Unavailable
from edged.repository import parse_model_config

start = engine_fakes.start_service
TWO_OUTPUTS = """name: "two"
backend: "doubling"
max_batch_size: 16
input [ { name: "input", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "output", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "negated", data_type: TYPE_FP32, dims: [ 4 ] } ]
dynamic_batching { }
parameters { key: "block_until_released" value: { string_value: "true" } }
"""


def validator_for(text: str, max_elements: int = 1000) -> RequestValidator:
    return RequestValidator(parse_model_config(text, "config.pbtxt"), max_elements)


SINGLE_BATCHED = validator_for('name: "m"\nmax_batch_size: 8\ninput [ { name: "x", data_type: TYPE_FP32, '
                               'dims: [ 3, 2 ] } ]\noutput [ { name: "y", data_type: TYPE_FP32, dims: [ 1 ] } ]')
SINGLE_UNBATCHED = validator_for('name: "m"\ninput [ { name: "x", data_type: TYPE_INT64, dims: [ 4 ] } ]\n'
                                 'output [ { name: "y", data_type: TYPE_FP32, dims: [ 1 ] } ]')
DTYPES = [np.float32, np.float64, np.int64, np.int32, np.uint8, np.float16]


def outcome(check: object, request: InferRequest) -> object:
    try:
        batch_size, inputs, signature = check(request)  # type: ignore[operator]
    except EdgedError as e:
        return type(e).__name__, str(e)
    return batch_size, {name: id(array) for name, array in inputs.items()}, signature


@settings(max_examples=300, deadline=None)
@given(validator=st.sampled_from([SINGLE_BATCHED, SINGLE_UNBATCHED]),
       shape=st.lists(st.integers(0, 10), min_size=0, max_size=4),
       dtype=st.sampled_from(DTYPES), name=st.sampled_from(["x", "z"]), extra=st.booleans(),
       outputs=st.sampled_from([(), ("y",), ("nope",)]))
def test_the_single_input_check_answers_as_the_general_check(validator: RequestValidator, shape: list[int],
                                                             dtype: type, name: str, extra: bool,
                                                             outputs: tuple[str, ...]) -> None:
    inputs = {name: np.zeros(shape, dtype)}
    if extra:
        inputs["extra"] = np.zeros((1, 1), np.float32)
    request = InferRequest("m", inputs, outputs=tuple(RequestedOutput(o) for o in outputs))
    assert outcome(validator.check, request) == outcome(validator._check, request)


def test_the_single_input_check_refuses_what_the_general_check_refuses() -> None:
    too_big = validator_for('name: "m"\nmax_batch_size: 8\ninput [ { name: "x", data_type: TYPE_FP32, dims: [ 64 ] '
                            '} ]\noutput [ { name: "y", data_type: TYPE_FP32, dims: [ 1 ] } ]', max_elements=100)
    with pytest.raises(EdgedError, match="has 128 elements, more than the limit of 100"):
        too_big.check(InferRequest("m", {"x": np.zeros((2, 64), np.float32)}))
    with pytest.raises(EdgedError, match=r"batch size 9, expected 1 to 8"):
        SINGLE_BATCHED.check(InferRequest("m", {"x": np.zeros((9, 3, 2), np.float32)}))
    with pytest.raises(EdgedError, match=r"has shape \[4, 2, 3\], expected \[-1, 3, 2\]"):
        SINGLE_BATCHED.check(InferRequest("m", {"x": np.zeros((4, 2, 3), np.float32)}))
    with pytest.raises(EdgedError, match="has datatype FP64, expected FP32"):
        SINGLE_BATCHED.check(InferRequest("m", {"x": np.zeros((1, 3, 2), np.float64)}))
    big_endian = np.arange(6, dtype=">f4").reshape(1, 3, 2)  # same type, other byte order: converted
    batch_size, inputs, _ = SINGLE_BATCHED.check(InferRequest("m", {"x": big_endian}))
    assert batch_size == 1 and inputs["x"].dtype == np.dtype(np.float32) and inputs["x"].dtype.isnative
    np.testing.assert_array_equal(inputs["x"], big_endian)


def test_a_queued_request_keeps_the_arrays_it_was_submitted_with(tmp_path: Path) -> None:
    """The caller may rebind its dict's entries for its next request while this one waits in the queue."""
    add_custom_model(tmp_path, "two", "doubling")
    (tmp_path / "two" / "config.pbtxt").write_text(TWO_OUTPUTS)
    service = start(tmp_path)
    try:
        hold_the_instance(service, "two")
        inputs = {"input": np.full((1, 4), 1, np.float32)}
        queued = Collector(1)
        service.submit(InferRequest("two", inputs), queued.done, inline=False)
        inputs["input"] = np.full((1, 4), 7, np.float32)  # rebinding, as a loop building the next request does
        engine_fakes.RELEASE.set()
        (response,) = queued.wait()
        np.testing.assert_array_equal(response.outputs["output"], np.full((1, 4), 2))
    finally:
        engine_fakes.RELEASE.set()
        service.close()


class Collector:
    def __init__(self, expected: int) -> None:
        self.results: list[InferResponse] = []
        self._expected = expected
        self._all = threading.Event()

    def done(self, result: InferResponse | EdgedError) -> None:
        assert isinstance(result, InferResponse), result
        self.results.append(result)
        if len(self.results) == self._expected:
            self._all.set()

    def wait(self) -> list[InferResponse]:
        assert self._all.wait(30), f"only {len(self.results)} of {self._expected} responses arrived"
        return self.results


def hold_the_instance(service: InferenceService, model: str) -> None:
    """Submit a request that runs and blocks (block_until_released): what follows queues up as one batch."""
    service.submit(InferRequest(model, {"input": np.full((1, 4), 100, np.float32)}), Collector(1).done,
                   inline=False)
    engine_fakes.wait_until_running()


@pytest.mark.parametrize("sizes", [[1, 1, 1, 1, 1], [1, 2, 1, 3]], ids=["rows", "mixed-sizes"])
def test_a_batch_is_split_into_each_requests_rows_and_the_outputs_it_asked_for(tmp_path: Path,
                                                                               sizes: list[int]) -> None:
    add_custom_model(tmp_path, "two", "doubling")
    (tmp_path / "two" / "config.pbtxt").write_text(TWO_OUTPUTS)
    service = start(tmp_path)
    try:
        hold_the_instance(service, "two")
        asked = [(), ("negated",), ("output",), ("negated", "output"), ()]
        collectors = []
        arrays = []
        for index, size in enumerate(sizes):
            array = np.arange(size * 4, dtype=np.float32).reshape(size, 4) + 10 * index
            wanted = tuple(RequestedOutput(name) for name in asked[index])
            collector = Collector(1)
            service.submit(InferRequest("two", {"input": array}, outputs=wanted, id=f"r{index}"), collector.done,
                           inline=False)
            collectors.append(collector)
            arrays.append(array)
        engine_fakes.RELEASE.set()
        for index, collector in enumerate(collectors):
            (response,) = collector.wait()
            assert response.id == f"r{index}"
            expected = {"output": arrays[index] * 2, "negated": -arrays[index]}
            names = asked[index] or ("output", "negated")
            assert sorted(response.outputs) == sorted(names)
            for name in names:
                np.testing.assert_array_equal(response.outputs[name], expected[name])
        assert engine_fakes.CONCURRENCY["batches"] == [1, sum(sizes)], "the queued requests should share a batch"
    finally:
        engine_fakes.RELEASE.set()
        service.close()


def test_the_latency_histogram_counts_every_request_of_a_batch_in_its_bucket() -> None:
    stats = VersionStats("m", "1")
    finished = 10_000_000_000
    same_bucket = [finished - 30_000, finished - 40_000, finished - 35_000]  # 30-40 µs: one bucket
    spread = [finished - 50_000, finished - 2_000_000, finished - 300_000_000]  # 50 µs, 2 ms, 300 ms
    for enqueued in (same_bucket, spread):
        stats.record_batch(len(enqueued), 1, 1, 1, finished - 1000, finished, enqueued)
    expected = [0] * len(stats.latency_counts)
    bounds = [round(b * 1e9) for b in (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                       0.5, 1.0, 2.5, 5.0, 10.0)]
    for enqueued in same_bucket + spread:
        expected[bisect.bisect_left(bounds, finished - enqueued)] += 1
    assert stats.latency_counts == expected
    assert stats.latency_sum_ns == sum(finished - e for e in same_bucket + spread)
    assert stats.success.count == 6 and stats.queue.ns == sum(finished - 1000 - e for e in same_bucket + spread)


def test_requests_without_a_version_go_to_the_newest_ready_version_after_each_change(tmp_path: Path) -> None:
    add_model(tmp_path, "mlp", 'name: "mlp"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
              'version_policy: { all: { } }', {1: mlp_weights(seed=1)})
    service = InferenceService(tmp_path, ModelsConfig(control_mode="explicit", startup_models=("mlp",),
                                                      warmup=False))
    service.start()
    try:
        x = {"input": np.ones((1, 64), np.float32)}
        assert service.infer(InferRequest("mlp", x)).version == "1"
        # version 2 arrives and version 1's new copy fails to load: the old version 1 keeps serving beside 2
        add_model(tmp_path, "mlp", None, {2: mlp_weights(seed=2)})
        (tmp_path / "mlp" / "1" / "model.onnx").write_bytes(b"truncated")
        service.load_model("mlp")
        assert service.infer(InferRequest("mlp", x)).version == "2"
        assert service.infer(InferRequest("mlp", x, version="1")).version == "1"
        service.unload_model("mlp")
        with pytest.raises(EdgedError, match="mlp"):
            service.infer(InferRequest("mlp", x))
        shutil.rmtree(tmp_path / "mlp" / "1")
        service.load_model("mlp")
        assert service.infer(InferRequest("mlp", x)).version == "2"
    finally:
        service.close()


def test_a_model_whose_outputs_do_not_split_by_row_still_answers_each_request(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """One output row for a batch of three: the batch cannot be split, so each request runs alone instead."""
    add_custom_model(tmp_path, "onerow", "doubling", 'dynamic_batching { }\nparameters [ { key: "first_row_only" '
                     'value: { string_value: "true" } }, { key: "block_until_released" value: { string_value: "true" '
                     '} } ]', max_batch=16)
    service = start(tmp_path)
    try:
        hold_the_instance(service, "onerow")
        collectors = [Collector(1) for _ in range(3)]
        for value, collector in enumerate(collectors):
            service.submit(InferRequest("onerow", {"input": np.full((1, 4), value, np.float32)}), collector.done,
                           inline=False)
        engine_fakes.RELEASE.set()
        for value, collector in enumerate(collectors):
            (response,) = collector.wait()
            np.testing.assert_array_equal(response.outputs["output"], np.full((1, 4), 2 * value))
        assert engine_fakes.CONCURRENCY["batches"] == [1, 3, 1, 1, 1]
        assert "output 'output' has shape [1, 4] for a batch of 3 rows" in caplog.text
    finally:
        engine_fakes.RELEASE.set()
        service.close()


@pytest.mark.timeout(120)
def test_requests_during_reloads_and_unloads_get_their_versions_answer_or_a_clean_error(tmp_path: Path) -> None:
    """Callers keep submitting while the model flips between one and two versions and is unloaded: each answer
    comes from the version it names, computed with that version's weights, or is a clean refusal; none hangs."""
    weights = {1: mlp_weights(seed=1), 2: mlp_weights(seed=2)}
    config = 'name: "mlp"\nbackend: "onnxruntime"\nmax_batch_size: 8\ndynamic_batching { }\n'
    add_model(tmp_path, "mlp", config, {1: weights[1]})
    service = InferenceService(tmp_path, ModelsConfig(control_mode="explicit", startup_models=("mlp",),
                                                      warmup=False))
    service.start()
    x = np.random.default_rng(3).random((1, 64), dtype=np.float32)
    expected = {str(v): mlp_reference(w, x) for v, w in weights.items()}
    stop = threading.Event()
    answers = {"1": 0, "2": 0, "refused": 0}
    problems: list[str] = []

    def caller() -> None:
        while not stop.is_set():
            try:
                response = service.infer(InferRequest("mlp", {"input": x}), timeout_s=10)
            except (ModelNotReady, ModelNotFound, Unavailable) as e:
                answers["refused"] += 1
                if "before the request ran" in str(e):  # an unload drains its queue first: this means a stall
                    problems.append(repr(e))
                    return
                continue
            except Exception as e:  # anything else is a defect
                problems.append(repr(e))
                return
            if not np.allclose(response.outputs["output"], expected[response.version], atol=1e-5):
                problems.append(f"version {response.version} answered with another version's weights")
                return
            answers[response.version] += 1

    callers = [threading.Thread(target=caller) for _ in range(4)]
    for thread in callers:
        thread.start()
    try:
        for _ in range(5):
            add_model(tmp_path, "mlp", config.replace("{ }", "{ }\nversion_policy: { all: { } }"), {2: weights[2]})
            service.load_model("mlp")  # versions 1 and 2; the default moves to 2
            (tmp_path / "mlp" / "config.pbtxt").write_text(config)  # latest 1: only version 2 stays
            service.load_model("mlp")
            service.unload_model("mlp")
            service.load_model("mlp")
            shutil.rmtree(tmp_path / "mlp" / "2")  # back to version 1 alone
            service.load_model("mlp")
    finally:
        stop.set()
        for thread in callers:
            thread.join(30)
        service.close()
    assert not problems, problems
    assert not any(thread.is_alive() for thread in callers), "a caller hung"
    workers = [thread.name for thread in threading.enumerate() if thread.name.startswith("edged-mlp-")]
    assert not workers, f"worker threads of unloaded versions still alive (asleep through their close): {workers}"
    assert answers["1"] and answers["2"], answers


def test_a_request_run_alone_is_counted_as_a_batch_of_one_would_be() -> None:
    alone, batch = VersionStats("m", "1"), VersionStats("m", "1")
    for started, merged, ran, finished in ((1_000, 1_200, 31_200, 32_000), (50_000, 50_100, 2_050_100, 2_051_000)):
        alone.record_alone(1, merged - started, ran - merged, started, finished)
        batch.record_batch(1, merged - started, ran - merged, finished - ran, started, finished, [started])
    documents = [stats.as_json() for stats in (alone, batch)]
    for doc in documents:
        doc.pop("last_inference")
    assert documents[0] == documents[1]
    assert alone.latency_histogram() == batch.latency_histogram()


def test_lone_records_past_the_fold_bound_and_between_reads_are_all_counted() -> None:
    # record_alone keeps its records and adds them to the counters when they are read or _FOLD_AT are kept:
    # what is read is exactly what a batch of one per request leaves, whenever it is read
    alone, batch = VersionStats("m", "1"), VersionStats("m", "1")
    for index in range(_FOLD_AT + 7):
        started = 10_000 * index
        merged, ran, finished = started + 100 + index % 3, started + 2_000 + 37 * index, started + 3_000 + 53 * index
        size = 1 + index % 4
        alone.record_alone(size, merged - started, ran - merged, started, finished)
        batch.record_batch(size, merged - started, ran - merged, finished - ran, started, finished, [started])
        if index in (0, 5, _FOLD_AT - 1, _FOLD_AT + 1):
            assert alone.inference_count == batch.inference_count
            assert alone.latency_histogram() == batch.latency_histogram()
    documents = [stats.as_json() for stats in (alone, batch)]
    for doc in documents:
        doc.pop("last_inference")
    assert documents[0] == documents[1]
    assert documents[0]["execution_count"] == _FOLD_AT + 7


def test_lone_inline_requests_leave_exact_statistics(tmp_path: Path) -> None:
    add_model(tmp_path, "mlp", 'name: "mlp"\nbackend: "onnxruntime"\nmax_batch_size: 8', {1: mlp_weights(seed=1)})
    service = InferenceService(tmp_path, ModelsConfig(control_mode="explicit", startup_models=("mlp",),
                                                      warmup=False))
    service.start()
    try:
        for rows in (1, 2, 1, 3):
            x = np.ones((rows, 64), np.float32)
            assert service.infer(InferRequest("mlp", {"input": x})).outputs["output"].shape[0] == rows
        doc = service.statistics("mlp")["model_stats"][0]
        stats = doc["inference_stats"]
        assert doc["inference_count"] == 7 and doc["execution_count"] == 4
        for part in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
            assert stats[part]["count"] == 4, part
        assert stats["compute_infer"]["ns"] > 0 and stats["fail"]["count"] == 0
        assert {b["batch_size"]: b["compute_infer"]["count"] for b in doc["batch_stats"]} == {1: 2, 2: 1, 3: 1}
        counts, _, total = service.loaded_versions()[0].stats.latency_histogram()
        assert sum(counts) == total == 4
    finally:
        service.close()

"""`InferenceService.infer_async`: coroutines on one loop share batches; errors and worker-thread completions."""

from __future__ import annotations

import asyncio
from pathlib import Path

import engine_fakes
import numpy as np
import pytest
from modelgen import BUNDLED_MODELS, add_custom_model

from edged.config import ModelsConfig
from edged.engine import InferenceService, InferRequest
from edged.errors import InvalidInput, ModelNotFound


def test_coroutines_awaiting_in_one_loop_turn_share_a_batch() -> None:
    service = InferenceService(BUNDLED_MODELS, ModelsConfig(control_mode="explicit", startup_models=("tiny_mlp",)))
    service.start()
    try:
        rng = np.random.default_rng(0)
        xs = [rng.random((1, 64), dtype=np.float32) for _ in range(16)]

        async def main() -> list[np.ndarray]:
            responses = await asyncio.gather(*(service.infer_async(InferRequest("tiny_mlp", {"input": x}))
                                               for x in xs))
            return [r.outputs["output"] for r in responses]

        outputs = asyncio.run(main())
        for x, out in zip(xs, outputs, strict=True):
            np.testing.assert_allclose(out, service.infer(InferRequest("tiny_mlp", {"input": x})).outputs["output"],
                                       rtol=1e-6)
        sizes = [b["batch_size"] for b in service.statistics("tiny_mlp")["model_stats"][0]["batch_stats"]]
        assert 16 in sizes
    finally:
        service.close()


def test_errors_reach_the_awaiting_coroutine_and_others_still_run() -> None:
    service = InferenceService(BUNDLED_MODELS, ModelsConfig(control_mode="explicit", startup_models=("tiny_mlp",)))
    service.start()
    try:
        async def main() -> list[object]:
            return await asyncio.gather(
                service.infer_async(InferRequest("tiny_mlp", {"input": np.zeros((1, 63), np.float32)})),
                service.infer_async(InferRequest("nope", {"input": np.zeros((1, 64), np.float32)})),
                service.infer_async(InferRequest("tiny_mlp", {"input": np.zeros((1, 64), np.float32)})),
                return_exceptions=True)

        bad_shape, unknown, good = asyncio.run(main())
        assert isinstance(bad_shape, InvalidInput) and isinstance(unknown, ModelNotFound)
        assert good.outputs["output"].shape == (1, 10)
    finally:
        service.close()


def test_a_slow_model_completes_on_a_worker_thread_and_wakes_the_loop(tmp_path: Path) -> None:
    add_custom_model(tmp_path, "slow", "doubling", 'dynamic_batching { }\nparameters { key: "delay_s" value: '
                     '{ string_value: "0.01" } }', max_batch=16)
    engine_fakes.reset()
    service = InferenceService(tmp_path, ModelsConfig(backends={"doubling": "engine_fakes:DoublingBackend"},
                                                      warmup=False))
    service.start()
    try:
        assert not service.should_inline("slow")  # never timed: runs on worker threads, off the loop

        async def main() -> list[np.ndarray]:
            calls = [service.infer_async(InferRequest("slow", {"input": np.full((1, 4), v, np.float32)}))
                     for v in range(8)]
            return [r.outputs["output"] for r in await asyncio.gather(*calls)]

        outputs = asyncio.run(main())
        for value, out in enumerate(outputs):
            np.testing.assert_array_equal(out, np.full((1, 4), 2 * value))
    finally:
        service.close()


@pytest.mark.parametrize("concurrency", [1, 4])
def test_lazy_models_load_off_the_loop_on_first_await(tmp_path: Path, concurrency: int) -> None:
    add_custom_model(tmp_path, "lazy", "doubling")
    service = InferenceService(tmp_path, ModelsConfig(backends={"doubling": "engine_fakes:DoublingBackend"},
                                                      load="lazy", warmup=False))
    service.start()
    try:
        async def main() -> int:
            results = await asyncio.gather(*(service.infer_async(
                InferRequest("lazy", {"input": np.ones((1, 4), np.float32)})) for _ in range(concurrency)))
            return len(results)

        assert asyncio.run(main()) == concurrency
    finally:
        service.close()

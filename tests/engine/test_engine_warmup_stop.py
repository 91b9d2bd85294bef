"""A stop that begins during a long warm-up ends the load at the next warm-up run, not after all of them."""

from __future__ import annotations

import threading
from pathlib import Path

import engine_fakes
from engine_fakes import BACKENDS, reset, wait_until_running
from modelgen import add_custom_model

from edged.config import ModelsConfig
from edged.engine import InferenceService
from edged.errors import EdgedError, Unavailable

WARMUP = ('model_warmup [ { name: "w", batch_size: 1, count: 10000, inputs { key: "input" value: { data_type: '
          'TYPE_FP32, dims: [ 4 ], zero_data: true } } } ]\n'
          'parameters { key: "block_until_released" value: { string_value: "true" } }\n')


def test_a_stop_during_warm_up_abandons_the_load_at_the_next_run(tmp_path: Path) -> None:
    add_custom_model(tmp_path, "w", "doubling", WARMUP)
    reset()
    service = InferenceService(tmp_path, ModelsConfig(control_mode="explicit", backends=BACKENDS))
    service.start()
    outcome: list[EdgedError | None] = []

    def load() -> None:
        try:
            service.load_model("w")
            outcome.append(None)
        except EdgedError as e:
            outcome.append(e)

    loader = threading.Thread(target=load, daemon=True)
    try:
        loader.start()
        wait_until_running()  # the first warm-up run holds the instance until released
        service.stop_loading()
        engine_fakes.RELEASE.set()  # from here each run returns at once: 10002 of them would end the load READY
        loader.join(60)
        assert not loader.is_alive()
        (error,) = outcome
        assert isinstance(error, Unavailable), error
        assert "load abandoned during warm-up: the daemon is stopping" in str(error)
        assert engine_fakes.CONCURRENCY["calls"] == 1  # the run under way when the stop began, and no other
    finally:
        engine_fakes.RELEASE.set()
        service.close()

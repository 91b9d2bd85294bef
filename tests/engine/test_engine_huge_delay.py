"""A batching delay longer than a thread can wait in one go (a config built in code, past the builder's bound of a
day) keeps the worker alive: the worker waits in bounded steps, and a batch that fills runs at once."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import numpy as np
from engine_fakes import BACKENDS, reset
from modelgen import add_custom_model, custom_config

from edged.config import ModelsConfig
from edged.engine import InferenceService, InferRequest, InferResponse
from edged.errors import EdgedError
from edged.repository import parse_model_config
from edged.repository.model_config import DynamicBatching


def test_a_uint64_batching_delay_does_not_kill_the_worker(tmp_path: Path) -> None:
    add_custom_model(tmp_path, "m", "doubling", max_batch=4)
    config = parse_model_config(custom_config("m", "doubling", max_batch=4))
    override = dataclasses.replace(config, dynamic_batching=DynamicBatching(max_queue_delay_microseconds=2**64 - 1))
    reset()
    service = InferenceService(tmp_path, ModelsConfig(control_mode="explicit", backends=BACKENDS, warmup=False))
    service.start()
    answers: list[InferResponse | EdgedError] = []
    all_in = threading.Event()

    def done(result: InferResponse | EdgedError) -> None:
        answers.append(result)
        if len(answers) == 4:
            all_in.set()

    try:
        service.load_model("m", override)
        scheduler = service.record_for("m").versions[1].scheduler
        assert scheduler is not None
        x = np.ones((1, 4), np.float32)
        service.submit(InferRequest("m", {"input": x}), done, inline=False)
        for _ in range(30_000):  # the worker takes the lone request and waits out the delay
            if scheduler.delaying:
                break
            threading.Event().wait(0.001)
        for _ in range(3):  # a full batch ends the delay; before, the worker had died with OverflowError
            service.submit(InferRequest("m", {"input": x}), done, inline=False)
        assert all_in.wait(30), answers
        for answer in answers:
            assert isinstance(answer, InferResponse), answer
            np.testing.assert_array_equal(answer.outputs["output"], x * 2)
    finally:
        service.close()

"""The in-process floor of scripts/bench_vs_triton.py's camera rows: the daemon's config, warm, random frames."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from edged.bench._floor import EngineFloor, random_inputs
from edged.repository import parse_model_config

MODELS = Path(__file__).resolve().parents[2] / "models"


def test_random_inputs_cover_an_integer_types_range_as_perf_analyzer_sends() -> None:
    config = parse_model_config((MODELS / "camera_frame" / "config.pbtxt").read_text())
    frame = random_inputs(config)["frame"]
    assert frame.shape == (1, 1080, 1920, 3) and frame.dtype == np.uint8
    # edged bench's make_inputs casts floats in [0, 1) to UINT8: every pixel 0
    assert frame.min() == 0 and frame.max() == 255 and 120 < frame.mean() < 135


@pytest.mark.timeout(120)
def test_the_floor_runs_the_served_repository_copy_and_counts_its_cpu(tmp_path: Path) -> None:
    shutil.copytree(MODELS / "camera_frame", tmp_path / "camera_frame")
    floor = EngineFloor(tmp_path, "camera_frame", warmup_s=0.2)
    try:
        windows = [floor.measure(0.3) for _ in range(2)]
    finally:
        floor.close()
    for result, cpu_s in windows:
        assert result.requests >= 1 and result.errors == 0
        assert 0 < result.p50_us <= result.p99_us
        assert cpu_s > 0  # the model ran in this process: its CPU is this process's

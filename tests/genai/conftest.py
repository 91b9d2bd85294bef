"""A real edged server (Unix socket and loopback TCP) with the bundled generative model, and an in-process
ONNX Runtime GenAI reference on the same model folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import server_harness as harness  # tests/server_harness.py

MODEL_DIR = harness.SAMPLE_MODELS / "tiny_llama" / "1"


@pytest.fixture(scope="module")
def genai_server() -> Iterator[harness.ThreadedServer]:
    pytest.importorskip("onnxruntime_genai")
    running = harness.ThreadedServer(models=("tiny_llama", "tiny_mlp"), tcp=True).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return MODEL_DIR

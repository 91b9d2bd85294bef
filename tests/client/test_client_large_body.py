"""A camera frame in the body through EdgedClient to a server on asyncio's own event loop (the harness's): the
body reader swaps the transport's protocol there too, and the frame arrives byte for byte."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnxruntime as ort
import pytest
import server_harness as harness

from edged.client import EdgedClient


@pytest.fixture(scope="module")
def camera_server() -> Iterator[harness.ThreadedServer]:
    running = harness.ThreadedServer(models=("camera_frame",), control_mode="explicit",
                                     startup_models=("camera_frame",)).start()
    yield running
    running.stop()


def test_camera_frames_in_the_body_match_onnxruntime_on_the_same_frames(
        camera_server: harness.ThreadedServer) -> None:
    session = ort.InferenceSession(str(harness.SAMPLE_MODELS / "camera_frame" / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    frames = [rng.integers(0, 256, (1, 1080, 1920, 3), dtype=np.uint8) for _ in range(2)]
    with EdgedClient(camera_server.socket_path, timeout_s=60) as client:  # one connection: the second frame
        answers = [client.infer("camera_frame", {"frame": frame}).outputs["features"] for frame in frames]
    for frame, answer in zip(frames, answers, strict=True):  # follows the first on a fresh parser
        (reference,) = session.run(["features"], {"frame": frame})
        assert np.allclose(answer, reference, atol=1e-5)
    assert not np.allclose(answers[0], answers[1])

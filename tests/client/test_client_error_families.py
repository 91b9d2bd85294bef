"""503s of different families reach the client as different errors (the X-Edged-Error header)."""

from __future__ import annotations

import numpy as np
import pytest
import server_harness as harness

from edged.client import EdgedClient, ModelNotReadyError, UnavailableError


def test_a_model_that_failed_to_load_is_model_not_ready_not_just_unavailable() -> None:
    server = harness.ThreadedServer(models=("tiny_mlp",))
    broken = server.repository / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.onnx").write_bytes(b"\x00 not an onnx file")
    server.start()
    try:
        with EdgedClient(server.socket_path) as client, pytest.raises(ModelNotReadyError) as caught:
            client.infer("broken", {"input": np.zeros((1, 64), np.float32)})
        assert caught.value.status == 503 and "broken" in str(caught.value)
        assert isinstance(caught.value, UnavailableError)
    finally:
        server.stop()

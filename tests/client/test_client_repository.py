"""The repository API through the client, on a real server in explicit model-control mode."""

from __future__ import annotations

import numpy as np
import pytest

from edged.client import EdgedClient, InvalidInputError, ServerError


def states(client: EdgedClient) -> dict[str, str]:
    return {m["name"]: m["state"] for m in client.repository_index()}


def test_load_and_unload_change_the_index_and_readiness(explicit_server) -> None:  # type: ignore[no-untyped-def]
    with EdgedClient(explicit_server.socket_path) as client:
        assert states(client)["tiny_mlp"] == "READY"
        assert states(client)["digits_onnx"] != "READY"
        assert client.model_ready("digits_onnx") is False
        client.load("digits_onnx")
        assert client.model_ready("digits_onnx") is True
        out = client.infer("digits_onnx", {"input": np.zeros((1, 64), np.float32)}).as_numpy("output")
        assert out.shape == (1, 10)
        client.unload("digits_onnx")
        assert client.model_ready("digits_onnx") is False
        assert states(client)["digits_onnx"] != "READY"
        with pytest.raises(ServerError) as raised:
            client.infer("digits_onnx", {"input": np.zeros((1, 64), np.float32)})
        assert "digits_onnx" in str(raised.value)


def test_load_with_an_override_config_applies_it(explicit_server) -> None:  # type: ignore[no-untyped-def]
    with EdgedClient(explicit_server.socket_path) as client:
        config = client.model_config("tiny_mlp")
        # the preferred batch size (64, Triton's default of max_batch_size) shrinks with it, as Triton requires
        client.load("tiny_mlp", {**config, "max_batch_size": 8,
                                 "dynamic_batching": {**config["dynamic_batching"], "preferred_batch_size": [8]}})
        assert client.model_config("tiny_mlp")["max_batch_size"] == 8
        with pytest.raises(InvalidInputError, match="8"):
            client.infer("tiny_mlp", {"input": np.zeros((9, 64), np.float32)})
        client.load("tiny_mlp")
        assert client.model_config("tiny_mlp")["max_batch_size"] == 64


def test_loading_a_model_not_in_the_repository_fails_with_its_name(explicit_server) -> None:  # type: ignore[no-untyped-def]
    with EdgedClient(explicit_server.socket_path) as client, pytest.raises(ServerError, match="ghost"):
        client.load("ghost")

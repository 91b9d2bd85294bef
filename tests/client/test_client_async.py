"""AsyncEdgedClient against the real server on a real Unix socket: the same calls as coroutines, concurrent
requests on pooled keep-alive connections, typed errors and timeouts."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import numpy as np
import pytest

from edged.client import (
    AsyncEdgedClient,
    ClientTimeout,
    EdgedClient,
    InvalidInputError,
    ModelNotFoundError,
    ServerUnreachable,
)


def test_every_read_call_answers(server) -> None:  # type: ignore[no-untyped-def]
    async def scenario() -> None:
        async with AsyncEdgedClient(server.socket_path, timeout_s=10) as client:
            assert await client.live() and await client.ready()
            assert (await client.server_metadata())["name"] == "edged"
            assert (await client.model_metadata("tiny_mlp"))["outputs"][0]["name"] == "output"
            assert (await client.model_config("tiny_mlp", "1"))["max_batch_size"] == 64
            assert await client.model_ready("tiny_mlp")
            assert {m["name"] for m in await client.repository_index()} >= {"tiny_mlp"}
            assert "model_stats" in await client.statistics("tiny_mlp")
            assert (await client.status())["ready"] is True
            assert "nv_inference_count" in await client.metrics()
    asyncio.run(scenario())


def test_concurrent_infers_each_get_their_own_answer(server) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(3)
    batches = [rng.standard_normal((1 + i % 4, 64)).astype(np.float32) for i in range(32)]

    async def scenario() -> list[np.ndarray]:
        async with AsyncEdgedClient(server.socket_path, timeout_s=10) as client:
            results = await asyncio.gather(*(client.infer("tiny_mlp", {"input": b}, request_id=str(i),
                                                          binary=i % 2 == 0)
                                             for i, b in enumerate(batches)))
            assert [r.id for r in results] == [str(i) for i in range(32)]
            return [r.as_numpy("output") for r in results]

    outputs = asyncio.run(scenario())
    with EdgedClient(server.socket_path) as sync:
        for batch, out in zip(batches, outputs, strict=True):
            np.testing.assert_allclose(out, sync.infer("tiny_mlp", {"input": batch}).as_numpy("output"),
                                       rtol=1e-5, atol=1e-6)


def test_errors_are_typed_and_the_connection_survives_them(server) -> None:  # type: ignore[no-untyped-def]
    async def scenario() -> None:
        async with AsyncEdgedClient(server.socket_path) as client:
            with pytest.raises(ModelNotFoundError, match="nope"):
                await client.model_config("nope")
            with pytest.raises(InvalidInputError, match="'input'"):
                await client.infer("tiny_mlp", {"input": np.zeros((1, 3), np.float32)})
            assert await client.live()
    asyncio.run(scenario())


def test_nothing_listening_is_server_unreachable(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncEdgedClient(tmp_path / "none.sock") as client:
            await client.live()
    with pytest.raises(ServerUnreachable, match=r"none\.sock.*edged serve"):
        asyncio.run(scenario())


def test_a_silent_server_is_client_timeout(tmp_path: Path) -> None:
    path = str(tmp_path / "silent.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)

    async def scenario() -> None:
        async with AsyncEdgedClient(path, timeout_s=0.2) as client:
            await client.ready()
    with pytest.raises(ClientTimeout, match=r"within 0\.2 s"):
        asyncio.run(scenario())
    listener.close()
    os.unlink(path)

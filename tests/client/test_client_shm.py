"""The client's shared-memory helpers against the real server over the Unix socket: regions made with the
standard library, registered, used for inputs and outputs by the sync and asyncio clients."""

from __future__ import annotations

import asyncio
import grp
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from edged.client import (
    AsyncEdgedClient,
    EdgedClient,
    InvalidInputError,
    SharedMemoryRegion,
    ShmOutput,
    ShmTensor,
    share_with,
)
from edged.client.shm import tensor_for


def _key(name: str) -> str:
    return f"/edged_client_{os.getpid()}_{name}"


def test_sync_client_reads_inputs_from_and_writes_outputs_to_shared_memory(server) -> None:  # type: ignore[no-untyped-def]
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    with EdgedClient(server.socket_path) as client, SharedMemoryRegion.create(_key("sync"), 4096) as region:
        expected = client.infer("tiny_mlp", {"input": x}).as_numpy("output")
        region.write(x)
        client.register_system_shared_memory("sync", region.key, region.byte_size)
        try:
            assert client.system_shared_memory_status("sync") == [
                {"name": "sync", "key": region.key, "offset": 0, "byte_size": 4096}]
            result = client.infer("tiny_mlp", {"input": tensor_for(x, "sync")},
                                  shm_outputs={"output": ShmOutput("sync", 2 * 10 * 4, offset=2048)})
            assert "output" not in result.outputs and result.shape("output") == [2, 10]
            got = region.read(np.float32, result.shape("output"), offset=2048)
            np.testing.assert_allclose(got, expected, rtol=1e-6)
            with pytest.raises(InvalidInputError, match="shared_memory_byte_size"):
                client.infer("tiny_mlp", {"input": ShmTensor("sync", (2, 64), "FP32", byte_size=100)})
        finally:
            client.unregister_system_shared_memory("sync")
        assert client.system_shared_memory_status() == []


def test_asyncio_client_uses_shared_memory_inputs(server) -> None:  # type: ignore[no-untyped-def]
    x = np.ones((1, 64), np.float32)

    async def scenario(region: SharedMemoryRegion) -> np.ndarray:
        async with AsyncEdgedClient(server.socket_path) as client:
            await client.register_system_shared_memory("aio", region.key, region.byte_size)
            try:
                result = await client.infer("tiny_mlp", {"input": tensor_for(x, "aio")})
                return result.as_numpy("output")
            finally:
                await client.unregister_system_shared_memory()

    with EdgedClient(server.socket_path) as client:
        expected = client.infer("tiny_mlp", {"input": x}).as_numpy("output")
    with SharedMemoryRegion.create(_key("aio"), x.nbytes) as region:
        region.write(x)
        np.testing.assert_allclose(asyncio.run(scenario(region)), expected, rtol=1e-6)


def test_regions_are_created_with_the_mode_asked_for_and_removed_on_close() -> None:
    region = SharedMemoryRegion.create(_key("mode"), 64)
    path = Path("/dev/shm") / _key("mode").lstrip("/")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    region.close()
    assert not path.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="changing an object's group to another group needs root")
def test_share_with_gives_an_object_to_a_group_with_mode_0660() -> None:
    group = grp.getgrgid(65534).gr_name
    with SharedMemoryRegion.create(_key("share"), 64) as region:
        path = Path("/dev/shm") / region.key.lstrip("/")
        share_with(region.key, group)
        info = path.stat()
        assert (info.st_gid, stat.S_IMODE(info.st_mode)) == (65534, 0o660)


def test_bad_keys_and_sizes_are_refused_before_anything_is_created() -> None:
    for key in ("/a/b", "..", ""):
        with pytest.raises(ValueError, match="POSIX shared-memory name"):
            SharedMemoryRegion.create(key, 64)
    with pytest.raises(ValueError, match="positive"):
        SharedMemoryRegion.create(_key("zero"), 0)

"""``AsyncEdgedClient``: the asyncio twin of ``EdgedClient``, with the same methods as coroutines.

    async with AsyncEdgedClient() as client:
        results = await asyncio.gather(*(client.infer("tiny_mlp", {"input": x}) for x in batches))

Concurrent calls run on separate keep-alive connections from a small pool.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from edged.client import _calls as calls
from edged.client._async_transport import AsyncTransport
from edged.client._result import Array, InferResult
from edged.client.shm import ShmOutput, ShmTensor

DEFAULT_TIMEOUT_S = 60.0  # the same as EdgedClient's


class AsyncEdgedClient:
    def __init__(self, socket_path: str | os.PathLike[str] | None = None, timeout_s: float | None = DEFAULT_TIMEOUT_S,
                 environ: Mapping[str, str] | None = None) -> None:
        self._transport = AsyncTransport(socket_path, timeout_s, environ)

    @property
    def socket_path(self) -> str | None:
        """The socket of the current or last connection (None before the first call)."""
        return self._transport.socket_path

    async def close(self) -> None:
        await self._transport.close()

    async def __aenter__(self) -> AsyncEdgedClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        await self.close()

    async def _run(self, call: calls.Call) -> calls.Reply:
        return await self._transport.exchange(call)

    # --- health and metadata ---------------------------------------------------------------------------------
    async def live(self) -> bool:
        return calls.read_health(await self._run(calls.get("/v2/health/live", "liveness")))

    async def ready(self) -> bool:
        return calls.read_health(await self._run(calls.get("/v2/health/ready", "readiness")))

    async def server_metadata(self) -> dict[str, Any]:
        call = calls.get("/v2", "server metadata")
        return calls.read_dict(call, await self._run(call))

    async def model_metadata(self, model: str, version: str = "") -> dict[str, Any]:
        call = calls.get(calls.model_path(model, version), f"metadata of model {model!r}")
        return calls.read_dict(call, await self._run(call))

    async def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        call = calls.get(calls.model_path(model, version, "/config"), f"config of model {model!r}")
        return calls.read_dict(call, await self._run(call))

    async def model_ready(self, model: str, version: str = "") -> bool:
        call = calls.get(calls.model_path(model, version, "/ready"), f"readiness of model {model!r}")
        return calls.read_model_ready(call, await self._run(call))

    # --- inference -------------------------------------------------------------------------------------------
    async def infer(self, model: str, inputs: Mapping[str, Array | ShmTensor], outputs: Sequence[str] | None = None,
                    version: str = "", binary: bool = True, request_id: str = "",
                    parameters: Mapping[str, Any] | None = None,
                    shm_outputs: Mapping[str, ShmOutput] | None = None) -> InferResult:
        """Inputs may be arrays or ``ShmTensor`` references to registered regions; outputs named in
        ``shm_outputs`` are written to their regions (``result.shape(name)`` gives their shapes)."""
        call = calls.infer_call(model, inputs, outputs, version, binary, request_id, parameters, shm_outputs)
        return calls.read_infer(call, await self._run(call))

    # --- system shared memory (Triton's extension) -----------------------------------------------------------
    async def register_system_shared_memory(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        call = calls.shm_register_call(name, key, byte_size, offset)
        calls.checked(call, await self._run(call))

    async def unregister_system_shared_memory(self, name: str = "") -> None:
        """One region, or (without a name) every region this caller may use."""
        call = calls.shm_unregister_call(name)
        calls.checked(call, await self._run(call))

    async def system_shared_memory_status(self, name: str = "") -> list[dict[str, Any]]:
        call = calls.shm_status_call(name)
        return calls.read_list(call, await self._run(call))

    # --- statistics, repository, edged extensions ------------------------------------------------------------
    async def statistics(self, model: str = "", version: str = "") -> dict[str, Any]:
        call = calls.stats_call(model, version)
        return calls.read_dict(call, await self._run(call))

    async def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        call = calls.post_json("/v2/repository/index", "repository index", {"ready": ready_only})
        return calls.read_list(call, await self._run(call))

    async def load(self, model: str, config: Mapping[str, Any] | None = None) -> None:
        call = calls.load_call(model, config)
        calls.checked(call, await self._run(call))

    async def unload(self, model: str) -> None:
        call = calls.unload_call(model)
        calls.checked(call, await self._run(call))

    async def status(self) -> dict[str, Any]:
        call = calls.get("/v2/edged/status", "daemon status")
        return calls.read_dict(call, await self._run(call))

    async def telemetry(self) -> dict[str, Any]:
        call = calls.get("/v2/edged/telemetry", "telemetry")
        return calls.read_dict(call, await self._run(call))

    async def metrics(self) -> str:
        call = calls.get("/metrics", "metrics")
        return calls.read_text(call, await self._run(call))

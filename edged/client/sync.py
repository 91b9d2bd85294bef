"""``EdgedClient``: the blocking Python client of the daemon's Unix-socket API (KServe v2 + Triton extensions).

    with EdgedClient() as client:
        result = client.infer("tiny_mlp", {"input": np.zeros((1, 64), np.float32)})
        scores = result.as_numpy("output")

Errors are ``ClientError``s: ServerUnreachable names the sockets tried, HTTP error statuses become the typed
errors of ``edged.client`` (ModelNotFoundError, InvalidInputError, ...) carrying the daemon's message.
One client holds one keep-alive connection: use one client per thread (or AsyncEdgedClient for concurrency).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from edged.client import _calls as calls
from edged.client._result import Array, InferResult
from edged.client._sync_transport import SyncTransport
from edged.client.shm import ShmOutput, ShmTensor

DEFAULT_TIMEOUT_S = 60.0


class EdgedClient:
    def __init__(self, socket_path: str | os.PathLike[str] | None = None, timeout_s: float | None = DEFAULT_TIMEOUT_S,
                 environ: Mapping[str, str] | None = None) -> None:
        self._transport = SyncTransport(socket_path, timeout_s, environ)

    @property
    def socket_path(self) -> str | None:
        """The socket of the current or last connection (None before the first call)."""
        return self._transport.socket_path

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> EdgedClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def _run(self, call: calls.Call) -> calls.Reply:
        return self._transport.exchange(call)

    # --- health and metadata ---------------------------------------------------------------------------------
    def live(self) -> bool:
        return calls.read_health(self._run(calls.get("/v2/health/live", "liveness")))

    def ready(self) -> bool:
        return calls.read_health(self._run(calls.get("/v2/health/ready", "readiness")))

    def server_metadata(self) -> dict[str, Any]:
        call = calls.get("/v2", "server metadata")
        return calls.read_dict(call, self._run(call))

    def model_metadata(self, model: str, version: str = "") -> dict[str, Any]:
        call = calls.get(calls.model_path(model, version), f"metadata of model {model!r}")
        return calls.read_dict(call, self._run(call))

    def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        call = calls.get(calls.model_path(model, version, "/config"), f"config of model {model!r}")
        return calls.read_dict(call, self._run(call))

    def model_ready(self, model: str, version: str = "") -> bool:
        call = calls.get(calls.model_path(model, version, "/ready"), f"readiness of model {model!r}")
        return calls.read_model_ready(call, self._run(call))

    # --- inference -------------------------------------------------------------------------------------------
    def infer(self, model: str, inputs: Mapping[str, Array | ShmTensor], outputs: Sequence[str] | None = None,
                    version: str = "", binary: bool = True, request_id: str = "",
                    parameters: Mapping[str, Any] | None = None,
                    shm_outputs: Mapping[str, ShmOutput] | None = None) -> InferResult:
        """Inputs may be arrays or ``ShmTensor`` references to registered regions; outputs named in
        ``shm_outputs`` are written to their regions (``result.shape(name)`` gives their shapes)."""
        call = calls.infer_call(model, inputs, outputs, version, binary, request_id, parameters, shm_outputs)
        return calls.read_infer(call, self._run(call))

    # --- system shared memory (Triton's extension) -----------------------------------------------------------
    def register_system_shared_memory(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        call = calls.shm_register_call(name, key, byte_size, offset)
        calls.checked(call, self._run(call))

    def unregister_system_shared_memory(self, name: str = "") -> None:
        """One region, or (without a name) every region this caller may use."""
        call = calls.shm_unregister_call(name)
        calls.checked(call, self._run(call))

    def system_shared_memory_status(self, name: str = "") -> list[dict[str, Any]]:
        call = calls.shm_status_call(name)
        return calls.read_list(call, self._run(call))

    # --- statistics, repository, edged extensions ------------------------------------------------------------
    def statistics(self, model: str = "", version: str = "") -> dict[str, Any]:
        call = calls.stats_call(model, version)
        return calls.read_dict(call, self._run(call))

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        call = calls.post_json("/v2/repository/index", "repository index", {"ready": ready_only})
        return calls.read_list(call, self._run(call))

    def load(self, model: str, config: Mapping[str, Any] | None = None) -> None:
        call = calls.load_call(model, config)
        calls.checked(call, self._run(call))

    def unload(self, model: str) -> None:
        call = calls.unload_call(model)
        calls.checked(call, self._run(call))

    def status(self) -> dict[str, Any]:
        call = calls.get("/v2/edged/status", "daemon status")
        return calls.read_dict(call, self._run(call))

    def ota(self, action: str) -> dict[str, Any]:
        """``/v2/edged/ota/<action>``: "status" and "history" read; "check", "rollback" and "selftest" act
        (admin)."""
        path = f"/v2/edged/ota/{action}"
        call = (calls.get(path, f"OTA {action}") if action in ("status", "history")
                else calls.post_json(path, f"OTA {action}", {}))
        return calls.read_dict(call, self._run(call))

    def telemetry(self) -> dict[str, Any]:
        call = calls.get("/v2/edged/telemetry", "telemetry")
        return calls.read_dict(call, self._run(call))

    def metrics(self) -> str:
        call = calls.get("/metrics", "metrics")
        return calls.read_text(call, self._run(call))

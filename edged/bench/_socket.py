"""The socket transports (``uds`` and ``http``): a daemon measured from a separate client process."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from edged.bench._shm import shared_memory_jobs
from edged.bench._stats import Result, summarize
from edged.errors import ClientError
from edged.protocol import encode_request


def run_socket(label: str, transport: str, target: dict[str, Any], model: str, inputs: dict[str, Any],
               concurrency: int, duration_s: float, batch: int, shm: bool = False, body_kind: str = "binary") -> Result:
    if shm:
        with shared_memory_jobs(target, model, inputs, concurrency) as extra:
            completed = _run_worker({**target, "model": model, "concurrency": concurrency,
                                     "duration_s": duration_s, **extra}, duration_s)
        transport = f"{transport}+shm"
    else:
        body, header_length = encode_request(inputs, binary=body_kind == "binary")
        transport = transport if body_kind == "binary" else f"{transport}+json"
        completed = _run_worker({**target, "model": model, "body_hex": body.hex(), "header_length": header_length,
                                 "concurrency": concurrency, "duration_s": duration_s}, duration_s)
    if completed.returncode != 0:
        raise ClientError(f"load generator failed: {completed.stderr.strip()[-2000:]}")
    return _summary(label, transport, model, concurrency, batch, completed.stdout)


def _run_worker(job: dict[str, Any], duration_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edged.bench._socket_worker"], input=json.dumps(job),
                          capture_output=True, text=True, timeout=duration_s + 60, check=False)


def _summary(label: str, transport: str, model: str, concurrency: int, batch: int, stdout: str) -> Result:
    result = json.loads(stdout)
    if result["errors"] and not result["latencies_us"]:
        raise ClientError(f"every request failed ({result['first_error']}); is model {model} loaded?")
    return summarize(label, transport, model, concurrency, batch, result["latencies_us"], result["errors"],
                     result["seconds"])


class _Connection:
    """The smallest GET over a Unix socket or TCP, for metadata and readiness before a run."""

    def __init__(self, target: dict[str, Any]) -> None:
        self.target = target

    def get(self, path: str) -> tuple[int, bytes]:
        import http.client

        from edged.client import UnixHTTPConnection

        connection: http.client.HTTPConnection
        if self.target.get("unix"):
            connection = UnixHTTPConnection(self.target["unix"], 5.0)
        else:
            connection = http.client.HTTPConnection(self.target["host"], self.target["port"], timeout=5)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def get_json(self, path: str) -> Any:
        status, body = self.get(path)
        if status != 200:
            raise ClientError(f"GET {path}: HTTP {status}: {body[:300]!r}")
        return json.loads(body)


def remote_inputs(target: dict[str, Any], model: str, batch: int) -> dict[str, Any]:
    import numpy as np

    from edged.protocol import KSERVE_TO_NUMPY

    try:
        metadata = _Connection(target).get_json(f"/v2/models/{model}")
    except OSError as e:
        where = target.get("unix") or f"{target.get('host')}:{target.get('port')}"
        raise ClientError(f"nothing answers on {where}: {e}; start the daemon (edged serve) or pass --spawn") from e
    rng = np.random.default_rng(0)
    inputs = {}
    for spec in metadata["inputs"]:
        shape = [d if d > 0 else 1 for d in spec["shape"]]
        if spec["shape"] and spec["shape"][0] == -1:
            shape[0] = batch
        inputs[spec["name"]] = rng.random(shape).astype(KSERVE_TO_NUMPY[spec["datatype"]])
    return inputs


def wait_ready(target: dict[str, Any], timeout_s: float) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if _Connection(target).get("/v2/health/ready")[0] == 200:  # Triton's ready: 200, empty body
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise ClientError(f"the spawned daemon was not ready within {timeout_s:.0f} s")
        time.sleep(0.1)

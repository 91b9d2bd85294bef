"""Shared-memory runs of the ``uds`` transport: one region per connection, registered for the run and removed
after it. Each connection's request is a JSON header that names its region for the inputs and the outputs; the
load generator copies the input into the region before every request, as a camera writes each frame."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from edged.client import EdgedClient, SharedMemoryRegion
from edged.errors import ClientError
from edged.protocol import KSERVE_TO_NUMPY, encode_request
from edged.protocol.codec import tensor_bytes

_ALIGN = 64


@contextlib.contextmanager
def shared_memory_jobs(target: dict[str, Any], model: str, inputs: dict[str, Any],
                       concurrency: int) -> Iterator[dict[str, Any]]:
    """The worker job's shared-memory fields (``shm_keys``, ``bodies_hex``, ``input_hex``) while the regions live."""
    if not target.get("unix"):
        raise ClientError("--shm needs the uds transport: over TCP shared memory is off unless "
                          "[server.tcp_restricted] shared-memory is set")
    raw = b"".join(_aligned(tensor_bytes(np.asarray(a))) for a in inputs.values())
    with EdgedClient(target["unix"]) as client:
        outputs = _output_bytes(client.model_metadata(model), next(iter(inputs.values())).shape[0])
        size = len(raw) + sum(_aligned_size(n) for n in outputs.values())
        with contextlib.ExitStack() as stack:
            keys, bodies = [], []
            for index in range(concurrency):
                name = f"edged-bench-{os.getpid()}-{index}"
                region = stack.enter_context(SharedMemoryRegion.create(f"/{name}", max(size, 1), mode=0o660))
                client.register_system_shared_memory(name, region.key, region.byte_size)
                stack.callback(client.unregister_system_shared_memory, name)
                keys.append(region.key)
                bodies.append(_request(name, inputs, outputs, len(raw)).hex())
            yield {"shm_keys": keys, "bodies_hex": bodies, "input_hex": raw.hex(), "header_length": None}


def _request(region: str, inputs: dict[str, Any], outputs: dict[str, int], input_bytes: int) -> bytes:
    placed, offset = [], 0
    for name, array in inputs.items():
        size = len(tensor_bytes(np.asarray(array)))
        placed.append({"name": name, "datatype": _datatype(array), "shape": list(array.shape), "parameters": {
            "shared_memory_region": region, "shared_memory_offset": offset, "shared_memory_byte_size": size}})
        offset += _aligned_size(size)
    placed_outputs, offset = {}, input_bytes
    for name, size in outputs.items():
        placed_outputs[name] = {"shared_memory_region": region, "shared_memory_offset": offset,
                                "shared_memory_byte_size": size}
        offset += _aligned_size(size)
    body, _ = encode_request({}, (), True, placed_inputs=placed, placed_outputs=placed_outputs)
    return body


def _datatype(array: Any) -> str:
    from edged.protocol import kserve_datatype

    return kserve_datatype(np.asarray(array))


def _output_bytes(metadata: dict[str, Any], batch: int) -> dict[str, int]:
    sizes = {}
    for entry in metadata.get("outputs", []):
        dtype = KSERVE_TO_NUMPY.get(str(entry.get("datatype", "")))
        shape = [batch if i == 0 and d == -1 else int(d) for i, d in enumerate(entry.get("shape", []))]
        if dtype is not None and dtype.kind != "O" and all(d >= 0 for d in shape):
            sizes[str(entry["name"])] = math.prod(shape) * dtype.itemsize
    return sizes


def _aligned_size(size: int) -> int:
    return -(-size // _ALIGN) * _ALIGN


def _aligned(raw: bytes) -> bytes:
    return raw + b"\0" * (_aligned_size(len(raw)) - len(raw))

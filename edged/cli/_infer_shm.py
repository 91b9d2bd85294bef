"""``edged infer --shm``: the inputs (and the outputs whose size the model's metadata fixes) travel through one
system shared-memory region instead of the request and response bodies.

The region is created by this process (mode 0660, so a daemon of the same group can open it), registered under
a name unique to the process, and unregistered and removed afterwards, whatever happens in between.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edged.client import EdgedClient, InferResult, SharedMemoryRegion, ShmOutput, ShmTensor
from edged.client.shm import tensor_for
from edged.protocol import KSERVE_TO_NUMPY
from edged.protocol.codec import tensor_bytes

Array = np.ndarray[Any, Any]
_ALIGN = 64  # tensors start on cache-line boundaries inside the region


def infer_through_shm(client: EdgedClient, model: str, inputs: Mapping[str, Array], metadata: dict[str, Any],
                      outputs: Sequence[str] | None, version: str, request_id: str) -> InferResult:
    batch = next(iter(inputs.values())).shape[0] if inputs else 1
    sizes = _output_sizes(metadata, outputs, batch)
    layout, total = _layout([len(tensor_bytes(a)) for a in inputs.values()] + [size for _, size, _ in sizes])
    name = f"edged-cli-{os.getpid()}"
    with SharedMemoryRegion.create(f"/{name}", max(total, 1), mode=0o660) as region:
        placed: dict[str, Array | ShmTensor] = {}
        for (input_name, array), offset in zip(inputs.items(), layout, strict=False):
            region.write(array, offset)
            placed[input_name] = tensor_for(array, name, offset)
        out_offsets = layout[len(inputs):]
        shm_outputs = {out: ShmOutput(name, size, offset) for (out, size, _), offset in zip(sizes, out_offsets,
                                                                                            strict=True)}
        client.register_system_shared_memory(name, region.key, region.byte_size)
        try:
            result = client.infer(model, placed, outputs, version, request_id=request_id, shm_outputs=shm_outputs)
        finally:
            client.unregister_system_shared_memory(name)
        read = dict(result.outputs)
        for (out, _, dtype), offset in zip(sizes, out_offsets, strict=True):
            read[out] = region.read(dtype, result.shape(out), offset)
    return InferResult(read, result.doc)


def _output_sizes(metadata: dict[str, Any], wanted: Sequence[str] | None,
                  batch: int) -> list[tuple[str, int, np.dtype[Any]]]:
    """(name, bytes, dtype) of each output whose size is known once the batch is: those go to the region."""
    sizes = []
    for entry in metadata.get("outputs", []):
        name = str(entry.get("name", ""))
        dtype = KSERVE_TO_NUMPY.get(str(entry.get("datatype", "")))
        if (wanted and name not in wanted) or dtype is None or dtype.kind == "O":
            continue
        shape = [batch if i == 0 and d == -1 else int(d) for i, d in enumerate(entry.get("shape", []))]
        if all(d >= 0 for d in shape):
            sizes.append((name, math.prod(shape) * dtype.itemsize, dtype))
    return sizes


def _layout(sizes: list[int]) -> tuple[list[int], int]:
    offsets, position = [], 0
    for size in sizes:
        offsets.append(position)
        position += -(-size // _ALIGN) * _ALIGN
    return offsets, position

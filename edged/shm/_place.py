"""Writing an output tensor into the shared-memory view a request named for it (both front ends use it)."""

from __future__ import annotations

from typing import Any

import numpy as np

from edged.errors import InvalidInput
from edged.protocol.codec import tensor_bytes


def write_output(name: str, array: np.ndarray[Any, Any], target: memoryview) -> None:
    """Row-major little-endian (BYTES length-prefixed) into ``target``, refused when it is too small."""
    raw = tensor_bytes(array) if array.dtype.kind in "OSU" else None
    size = array.nbytes if raw is None else len(raw)
    if size > len(target):
        raise InvalidInput(f"shared memory size specified with the request for output '{name}' "
                           f"({len(target)} bytes) should be at least {size} bytes to hold the results")
    if raw is not None:
        target[:size] = raw
    else:
        np.copyto(np.frombuffer(target, dtype=array.dtype.newbyteorder("<"), count=array.size)
                  .reshape(array.shape), array, casting="unsafe")

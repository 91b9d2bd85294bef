"""KServe v2 datatypes and their numpy representation."""

from __future__ import annotations

from typing import Any

import numpy as np

from edged.errors import InvalidInput

KSERVE_TO_NUMPY: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
_BY_KIND: dict[str, str] = {str(v): k for k, v in KSERVE_TO_NUMPY.items()}


def numpy_for(datatype: str, tensor: str) -> np.dtype[Any]:
    try:
        return KSERVE_TO_NUMPY[datatype]
    except KeyError:
        known = ", ".join(KSERVE_TO_NUMPY)
        raise InvalidInput(f"tensor {tensor!r}: unknown or unsupported datatype {datatype!r} (supported: "
                           f"{known})") from None


def kserve_datatype(array: np.ndarray[Any, Any]) -> str:
    """The KServe datatype of a numpy array (strings and bytes are BYTES)."""
    if array.dtype.kind in "OSU":
        return "BYTES"
    name = _BY_KIND.get(str(array.dtype.newbyteorder("=")))
    if name is None:
        raise InvalidInput(f"numpy dtype {array.dtype} has no KServe v2 datatype")
    return name

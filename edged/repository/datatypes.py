"""Triton data types (TYPE_FP32 ...) and the numpy dtypes that hold them."""

from __future__ import annotations

from typing import Any

import numpy as np

from edged.errors import ModelConfigError

TRITON_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": np.dtype(np.bool_), "TYPE_UINT8": np.dtype(np.uint8), "TYPE_UINT16": np.dtype(np.uint16),
    "TYPE_UINT32": np.dtype(np.uint32), "TYPE_UINT64": np.dtype(np.uint64), "TYPE_INT8": np.dtype(np.int8),
    "TYPE_INT16": np.dtype(np.int16), "TYPE_INT32": np.dtype(np.int32), "TYPE_INT64": np.dtype(np.int64),
    "TYPE_FP16": np.dtype(np.float16), "TYPE_FP32": np.dtype(np.float32), "TYPE_FP64": np.dtype(np.float64),
    "TYPE_STRING": np.dtype(np.object_),
}
NUMPY_TO_TRITON: dict[Any, str] = {v: k for k, v in TRITON_TO_NUMPY.items()}


def numpy_dtype(data_type: str) -> np.dtype[Any]:
    """The numpy dtype for a Triton data type; BF16 has none in numpy and is refused."""
    try:
        dtype: np.dtype[Any] = TRITON_TO_NUMPY[data_type]
    except KeyError:
        raise ModelConfigError(f"data type {data_type} is not supported by edged's numpy tensors "
                               f"(supported: {', '.join(TRITON_TO_NUMPY)})") from None
    return dtype

"""Tensor shapes from request metadata: checked before any data is read, so that no shape can make numpy fail.

Dimensions are exact JSON integers (``true`` is not a dimension); the product of the non-zero dimensions is
bounded by the element limit, since numpy refuses shapes whose other dimensions overflow its index type even
when a zero dimension makes the tensor empty (``[2**32, 2**32, 0]``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edged.errors import InvalidInput, PayloadTooLarge

MAX_RANK = 32  # numpy 1.x's NPY_MAXDIMS: a deeper shape could not be built into an array anyway


def shape_of(entry: Mapping[str, Any], name: str) -> tuple[int, ...]:
    shape = entry.get("shape")
    if type(shape) is list and len(shape) <= MAX_RANK:
        for dim in shape:  # a plain loop: this runs for every tensor of every request
            if type(dim) is not int or dim < 0:  # exact type: JSON true is a bool, not a dimension
                break
        else:
            return tuple(shape)
    raise InvalidInput(f"input {name!r}: \"shape\" must be a list of at most {MAX_RANK} non-negative integers, "
                       f"found {str(shape)[:200]}")


def element_count(name: str, shape: tuple[int, ...], max_elements: int) -> int:
    """The tensor's element count, refusing shapes whose non-zero dimensions alone pass ``max_elements``.

    A zero dimension makes the count 0, but numpy still refuses shapes whose other dimensions overflow its
    index type (``[2**32, 2**32, 0]``), so the bound applies to the product of the non-zero dimensions.
    """
    extent = 1
    zero = False
    for dim in shape:
        if dim == 0:
            zero = True
        else:
            extent *= dim
            if extent > max_elements:  # stop early: the product of huge dimensions can be very long
                raise PayloadTooLarge(f"input {name!r}: shape {str(list(shape))[:200]} has more than the limit "
                                      f"of {max_elements} elements")
    return 0 if zero else extent

"""Triton's shared-memory tensor parameters (``shared_memory_region``, ``shared_memory_offset``,
``shared_memory_byte_size``) on inputs and requested outputs.

The codec only reads the parameters and asks a resolver for the bytes; what a region is, who may use it and how
its bounds are checked belongs to ``edged.shm``. Without a resolver (MQTT, where payloads are on the broker
anyway) a tensor that names a region is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from edged.errors import InvalidInput

REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
BYTE_SIZE = "shared_memory_byte_size"


@dataclass(frozen=True, slots=True)
class ShmReference:
    """Where a tensor's bytes are: ``byte_size`` bytes from ``offset`` in the registered region ``region``."""

    region: str
    offset: int
    byte_size: int


# Returns a read-only view of exactly ``reference.byte_size`` bytes, or raises an EdgedError naming the region.
ShmReader = Callable[[ShmReference], memoryview]


def shm_reference(params: Mapping[str, Any], tensor: str, kind: str) -> ShmReference | None:
    """The reference in a tensor's parameters, or None when the tensor does not use shared memory."""
    region = params.get(REGION)
    if region is None:
        if OFFSET in params or BYTE_SIZE in params:
            raise InvalidInput(f"{kind} {tensor!r}: {OFFSET} or {BYTE_SIZE} given without {REGION}")
        return None
    if not isinstance(region, str) or not region:
        raise InvalidInput(f"{kind} {tensor!r}: {REGION} must be a non-empty string, found {region!r}")
    return ShmReference(region, _count(params, OFFSET, 0, tensor, kind), _count(params, BYTE_SIZE, None, tensor, kind))


def _count(params: Mapping[str, Any], key: str, default: int | None, tensor: str, kind: str) -> int:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"{kind} {tensor!r}: {key} must be a non-negative integer, found {value!r}")
    return value

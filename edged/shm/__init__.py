"""System shared memory for tensors (Triton's ``system_shared_memory`` extension): regions registered by
clients, mapped once, read and written in place by the front ends (HTTP and gRPC), with bounds, ownership and
limits checked here. ``cuda_shared_memory`` is not offered: CUDA IPC does not exist on Jetson's integrated GPU.
"""

from edged.shm._place import write_output
from edged.shm._region import SHM_DIR, Region, object_name
from edged.shm._registry import MAX_REGION_NAME_BYTES, TCP_CALLER, Caller, SharedMemoryRegistry, ShmLimits

__all__ = ["MAX_REGION_NAME_BYTES", "SHM_DIR", "TCP_CALLER", "Caller", "Region", "SharedMemoryRegistry", "ShmLimits",
           "object_name", "write_output"]

"""Thread-count parameters of the CPU runtimes (``intra_op_thread_count``, ``inter_op_thread_count``).

Bounded because a typo is not harmless: ONNX Runtime creates a session's threads at load (100000 of them took
minutes, holding the registry), and torch's OpenMP pool at its next run, where libgomp ends the whole process
when the system refuses a thread. No edge device has more than a few dozen cores.
"""

from __future__ import annotations

from collections.abc import Mapping

from edged.errors import ModelLoadError

MAX_THREADS = 64


def thread_count(parameters: Mapping[str, str], *keys: str) -> int | None:
    """The count the config sets under the first of ``keys`` it has (0: the runtime's default), None when it sets
    none of them."""
    key = next((k for k in keys if k in parameters), keys[0])
    value = parameters.get(key)
    if value is None or value.strip() == "":
        return None
    try:
        count = int(value)
    except ValueError:
        count = -1
    if not 0 <= count <= MAX_THREADS:
        raise ModelLoadError(f"parameter {key}: expected an integer from 0 to {MAX_THREADS} (0: the runtime's "
                             f"default), found {value!r}")
    return count

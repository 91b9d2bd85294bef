"""Memory budget and admission control for model versions (pure logic, no I/O).

The budget is ``memory.budget_mb`` or ``memory.budget_percent`` of MemTotal; neither means no limit. Each
loaded copy of a model version (its key, e.g. ``"resnet/1"``; a reload's new copy beside the serving one is
``"resnet/1 (reload)"``) is charged first with its expected peak while loading when admitted, then with its
measured footprint once loaded (``commit``), and discharged when unloaded (``release``). Both copies of a
reload stay charged while both are loaded. The expected peak of a file never loaded before is its size x
``memory.load_estimate_factor`` (by default the allocator's entry in PEAK_FACTORS); a file loaded before keeps
the peak measured then (``remember_peak``). Measured with ONNX Runtime on the CPU through the daemon
(scripts/bench_reload_peak.py, 48-49 MiB of weights, its default two instances, warm-up included): the load's
peak is 3.1-5.3x the file on glibc, whose freed 16 MiB blocks stay in its heap, and 2.4-3.1x under jemalloc and
tcmalloc (file bytes, parsed weights and prepacked copies coexist).
Estimates scale with the number of instances the load creates: every backend builds each instance from the file
on its own (an ONNX Runtime session, a deserialised TensorRT engine, a torch module, an ORT GenAI model), nothing
is shared, and the peak grows with the count (1, 2, 4, 8 sessions of that 48 MiB file: +92, +201, +377, +697
MiB). A load of M instances is estimated at max(1, M / FACTOR_INSTANCES) x file size x factor, or at M/N of a
peak measured with N instances, and never below INSTANCE_MIN_BYTES per instance.
Invariants: admitted charges never exceed the budget except while the keys ``admit`` returned for eviction
are still being unloaded; a candidate with requests in flight is never chosen; policy "refuse" chooses none.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from edged.config import MemoryConfig
from edged.errors import MemoryBudgetExceeded

MIB = 1024 * 1024
# Load peak / file size for a file never loaded before, by the allocator serving malloc (measured maxima,
# rounded up; see the module docstring). Unknown allocators get glibc's.
PEAK_FACTORS = {"system": 5.5, "jemalloc": 3.5, "tcmalloc": 3.5}
# The loads the factors were measured with: ONNX Runtime's default CPU instance count (Triton's, too).
FACTOR_INSTANCES = 2
# The least one instance is expected to add, whatever its file: an ONNX Runtime CPU session of a 10 KB model
# adds about 140 KiB (3000 sessions of digits_onnx: +420 MiB RSS).
INSTANCE_MIN_BYTES = 128 * 1024


@dataclass(frozen=True)
class EvictionCandidate:
    key: str
    last_used: float  # monotonic seconds of the last request; LRU = smallest first
    in_flight: int  # requests queued or running; > 0 means it cannot be evicted now


Evictable = Callable[[], Sequence[EvictionCandidate]]


def budget_bytes(config: MemoryConfig, total_memory_bytes: int) -> int | None:
    if config.budget_mb is not None:
        return int(config.budget_mb * MIB)
    if config.budget_percent is not None:
        return int(total_memory_bytes * config.budget_percent / 100)
    return None


class MemoryBudget:
    def __init__(self, config: MemoryConfig, total_memory_bytes: int, allocator: str = "system") -> None:
        self.limit_bytes = budget_bytes(config, total_memory_bytes)
        self._policy = config.policy
        self.factor = config.load_estimate_factor or PEAK_FACTORS.get(allocator, PEAK_FACTORS["system"])
        self._charges: dict[str, int] = {}
        self._measured: dict[str, tuple[int, int]] = {}  # per file identity: (peak, instances) measured
        self._lock = threading.Lock()

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(self._charges.values())

    def charges(self) -> Mapping[str, int]:
        with self._lock:
            return dict(self._charges)

    @property
    def free_bytes(self) -> int | None:
        """What a load may still add to the process's peak; None without a limit."""
        limit = self.limit_bytes
        return None if limit is None else max(0, limit - self.used_bytes)

    def estimate(self, key: str, file_bytes: int, instances: int = 1) -> int:
        """Bytes a load of ``instances`` instances of ``key`` is expected to need at its peak: the peak measured
        for it scaled to that many instances, else file size x factor (for up to FACTOR_INSTANCES instances,
        proportionally more beyond); never less than INSTANCE_MIN_BYTES per instance."""
        instances = max(1, instances)
        with self._lock:
            measured = self._measured.get(key)
        if measured is not None:
            peak, measured_instances = measured
            expected = peak * instances // measured_instances
        else:
            expected = int(file_bytes * self.factor * max(1.0, instances / FACTOR_INSTANCES))
        return max(expected, instances * INSTANCE_MIN_BYTES)

    def admit(self, key: str, needed_bytes: int, evictable: Evictable) -> list[str]:
        """Reserve ``needed_bytes`` for ``key``; return the keys the caller must unload first (LRU first).

        Raises MemoryBudgetExceeded when it cannot fit; then the charges are as before. ``evictable`` is
        called (only when eviction is needed) with the budget's lock held: it must not call the budget.
        """
        with self._lock:
            previous = self._charges.pop(key, None)  # a reload replaces its own charge
            try:
                victims = self._choose(key, needed_bytes, evictable)
            except MemoryBudgetExceeded:
                if previous is not None:
                    self._charges[key] = previous
                raise
            self._charges[key] = needed_bytes
            return victims

    def commit(self, key: str, measured_bytes: int) -> None:
        """Replace ``key``'s reservation with its measured footprint after the load."""
        with self._lock:
            self._charges[key] = measured_bytes

    def remember_peak(self, key: str, peak_bytes: int, instances: int = 1) -> None:
        """The peak a load of ``instances`` instances of ``key`` (a file's identity) was measured to need: what
        the next estimates for it are scaled from."""
        with self._lock:
            self._measured[key] = (peak_bytes, max(1, instances))

    def rename(self, old_key: str, new_key: str) -> None:
        """Move ``old_key``'s charge to ``new_key`` (a reload's new copy becomes the serving one)."""
        with self._lock:
            charge = self._charges.pop(old_key, None)
            if charge is not None:
                self._charges[new_key] = charge

    def release(self, key: str) -> None:
        """Discharge ``key`` (unloaded, evicted, or its load failed); unknown keys are ignored."""
        with self._lock:
            self._charges.pop(key, None)

    def _choose(self, key: str, needed: int, evictable: Evictable) -> list[str]:
        limit = self.limit_bytes
        if limit is None:
            return []
        used = sum(self._charges.values())
        if used + needed <= limit:
            return []
        if needed > limit:
            raise MemoryBudgetExceeded(self._message(key, needed, used, "it alone exceeds the budget"))
        if self._policy == "refuse":
            raise MemoryBudgetExceeded(self._message(key, needed, used, "policy 'refuse' evicts nothing"))
        victims: list[str] = []
        busy: list[str] = []
        for candidate in sorted(evictable(), key=lambda c: c.last_used):
            if candidate.key == key or candidate.key not in self._charges:
                continue
            if candidate.in_flight > 0:
                busy.append(candidate.key)
                continue
            victims.append(candidate.key)
            used -= self._charges[candidate.key]
            if used + needed <= limit:
                return victims
        why = "evicting every idle model would not free enough"
        if busy:
            why += f" ({', '.join(busy)} have requests in flight)"
        raise MemoryBudgetExceeded(self._message(key, needed, sum(self._charges.values()), why))

    def _message(self, key: str, needed: int, used: int, why: str) -> str:
        in_use = ", ".join(f"{k} {v / MIB:.1f} MiB" for k, v in sorted(self._charges.items())) or "nothing"
        limit = (self.limit_bytes or 0) / MIB
        return (f"cannot load {key}: it needs {needed / MIB:.1f} MiB at its peak while loading, the memory "
                f"budget is {limit:.1f} MiB and {used / MIB:.1f} MiB is in use ({in_use}); {why}")

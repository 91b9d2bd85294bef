"""Exports of a snapshot: Prometheus text exposition, and a compact MQTT summary with a byte budget.

Metric names follow DCGM-exporter's spirit (one gauge per physical quantity, labels for the instance).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from edged.errors import TelemetryError
from edged.exposition import Kind, MetricFamily, render


def _gauge(name: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]],
           kind: Kind = "gauge") -> MetricFamily:
    family = MetricFamily(name, kind, help_text)
    for labels, value in samples:
        family.add(value, labels)
    return family


def _sample_families(snapshot: Mapping[str, Any]) -> list[MetricFamily]:
    s: Mapping[str, Any] = snapshot.get("sample") or {}

    def one(value: Any, scale: float = 1.0) -> list[tuple[dict[str, str], float]]:
        return [] if value is None else [({}, float(value) * scale)]

    rails = [({"rail": k}, float(v["now"])) for k, v in (s.get("power_mw") or {}).items()]
    temps = [({"sensor": k}, float(v)) for k, v in (s.get("temps_c") or {}).items()]
    cpus = [({"core": str(i)}, float(c["load_pct"])) for i, c in enumerate(s.get("cpu") or [])
            if c.get("load_pct") is not None]
    return [
        _gauge("edged_gpu_utilization", "GPU load in percent.", one(s.get("gpu_load_pct"))),
        _gauge("edged_gpu_frequency_mhz", "GPU clock in MHz.", one(s.get("gpu_freq_mhz"))),
        _gauge("edged_memory_used_bytes", "RAM in use (shared by CPU and GPU).",
               one(s.get("ram_used_mb"), 1024 * 1024)),
        _gauge("edged_power_input_milliwatts", "Module input power (input rail or sum).",
               one(snapshot.get("power_in_mw"))),
        _gauge("edged_power_milliwatts", "Power per rail in mW.", rails),
        _gauge("edged_temperature_celsius", "Temperature per sensor.", temps),
        _gauge("edged_cpu_utilization", "CPU load per online core in percent.", cpus),
    ]


def render_prometheus(snapshot: Mapping[str, Any]) -> str:
    """Prometheus text exposition (version 0.0.4) of a `TelemetryService.snapshot()`.

    A stale snapshot (no sample for several intervals: the sampler failed or the source hangs) exports no
    readings at all, only ``edged_telemetry_stale 1`` and the age of the last sample: old values served as
    current would be worse than none.
    """
    stale = bool(snapshot.get("stale"))
    families = [] if stale else _sample_families(snapshot)
    energy = [({"model": k}, float(v)) for k, v in (snapshot.get("energy_per_inference_mj") or {}).items()]
    families.append(_gauge("edged_energy_per_inference_millijoules",
                           "Module energy attributed per inference, since start.", energy))
    # The same attribution as counters in base units: rate(joules) / rate(inferences) is the energy per
    # inference of any window. Inferences of intervals without a power reading are in neither.
    families.append(_gauge("edged_model_energy_joules_total", "Module energy attributed to the model's "
                           "inferences, in joules.", [({"model": k}, float(v) / 1000) for k, v in
                                                       (snapshot.get("energy_mj") or {}).items()], "counter"))
    families.append(_gauge("edged_model_energy_inferences_total", "Inferences the model's attributed energy "
                           "covers (those run while power was read).",
                           [({"model": k}, float(v)) for k, v in (snapshot.get("inferences") or {}).items()],
                           "counter"))
    throttles = [({"kind": k.split(":", 1)[0], "subject": k.split(":", 1)[1]}, float(v))
                 for k, v in (snapshot.get("throttle_counts") or {}).items()]
    families.append(_gauge("edged_throttle_events_total", "Times a frequency cap or a trip point was entered.",
                           throttles, "counter"))
    families.append(_gauge("edged_telemetry_samples_total", "Telemetry samples taken.",
                           [({"source": str(snapshot.get("source"))}, float(snapshot.get("samples") or 0))],
                           "counter"))
    source = {"source": str(snapshot.get("source"))}
    families.append(_gauge("edged_telemetry_bad_lines_total", "Source lines refused as not tegrastats or corrupt "
                           "(an impossible RAM field); skipped, not stored.",
                           [(source, float(snapshot.get("bad_lines") or 0))], "counter"))
    families.append(_gauge("edged_telemetry_fields_unread_total", "Fields of good lines not read: a name "
                           "unknown to edged, or a value no Jetson can report (the rest of the line is kept).",
                           [(source, float(snapshot.get("unread_fields") or 0))], "counter"))
    families.append(_gauge("edged_telemetry_rows_rejected_total", "Samples the store skipped because a value "
                           "does not fit 64 bits.", [({}, float(snapshot.get("store_rejected") or 0))], "counter"))
    families.append(_gauge("edged_telemetry_samples_dropped_total", "Samples lost before the database: writer "
                           "behind, or a failed write (disk full).",
                           [({}, float(snapshot.get("store_dropped") or 0))], "counter"))
    families.append(_gauge("edged_telemetry_stale", "1 while the newest telemetry sample is too old to be "
                           "current (its readings are then not exported).", [({}, float(stale))]))
    age = snapshot.get("last_sample_age_s")
    families.append(_gauge("edged_telemetry_last_sample_age_seconds", "Seconds since the newest telemetry sample.",
                           [] if age is None else [({}, float(age))]))
    return render(families, skip_empty=True)


def _compact(snapshot: Mapping[str, Any], level: int) -> dict[str, Any]:
    s: Mapping[str, Any] = snapshot.get("sample") or {}
    temps = s.get("temps_c") or {}
    out: dict[str, Any] = {"t": round(snapshot.get("t") or 0.0, 1), "gpu": s.get("gpu_load_pct"),
                           "cpu": _round(snapshot.get("cpu_load_pct")), "ram": s.get("ram_used_mb"),
                           "pin": snapshot.get("power_in_mw"),
                           "tmax": max(temps.values()) if temps else None}
    if level >= 1 and snapshot.get("throttle_active"):
        out["thr"] = list(snapshot["throttle_active"])
    if level >= 2:
        out["mj"] = {k: round(v, 2) for k, v in (snapshot.get("energy_per_inference_mj") or {}).items()}
    if level >= 3:
        out["temps"] = {k: round(v, 1) for k, v in temps.items()}
    return out


def _round(value: float | None) -> float | None:
    return round(value, 1) if value is not None else None


_DEADBAND = {"gpu": 5.0, "cpu": 5.0, "ram": 64.0, "pin": 250.0, "tmax": 1.0}


def _changed(now: Mapping[str, Any], before: Mapping[str, Any]) -> bool:
    for key, band in _DEADBAND.items():
        a, b = now.get(key), before.get(key)
        if (a is None) != (b is None) or (a is not None and b is not None and math.fabs(a - b) >= band):
            return True
    return now.get("thr") != before.get("thr")


def summary_payload(snapshot: Mapping[str, Any], previous: Mapping[str, Any] | None,
                    max_bytes: int) -> bytes | None:
    """A compact JSON summary for ``{prefix}/telemetry``, or None when nothing moved past the deadband.

    The richest form that fits ``max_bytes`` is chosen (per-sensor temperatures and per-model energy are
    dropped first). Raises `TelemetryError` when even the minimal form does not fit.
    """
    if previous is not None and not _changed(_compact(snapshot, 1), _compact(previous, 1)):
        return None
    for level in (3, 2, 1, 0):
        payload = json.dumps(_compact(snapshot, level), separators=(",", ":")).encode()
        if len(payload) <= max_bytes:
            return payload
    raise TelemetryError(f"telemetry summary needs at least {len(payload)} bytes, budget is {max_bytes}")

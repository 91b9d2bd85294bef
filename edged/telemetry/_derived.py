"""Derived numbers: input power, energy per inference per model, throttling and over-temperature events.

Energy attribution: over each interval between two samples, the module's input power (VDD_IN, POM_5V_IN, or
the sum of all rails where neither exists) times the interval is the energy spent. When models ran in that
interval, all of it is split between them by their share of the compute time they reported; an interval
without inference is idle energy and goes to no model. Energy per inference is then a model's attributed
energy over its inference count, since the service started.
An interval without a power reading has no known energy: its inferences are left out of the ratio (stored
with a NULL energy), never charged as free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from edged.telemetry._sample import Sample

INPUT_RAILS = ("VDD_IN", "POM_5V_IN", "VIN")


class ModelActivity(Protocol):
    """Implemented by the engine: (model name, counter) -> (inference_count, compute_ns), both cumulative.

    A counter is what restarts on its own: one loaded version ("1"), or a generative model's token count. Kept
    apart because a model's sum over its versions falls when one is removed, which cannot be told from a reload.
    """

    def model_activity(self) -> Mapping[tuple[str, str], tuple[int, int]]: ...


@dataclass(frozen=True)
class Event:
    t: float  # device elapsed time (edged.clock), the key that ages it
    kind: str  # "throttle", "throttle_end", "over_temperature", "over_temperature_end", "power_mode",
    #            "model_load", "model_unload", ...
    subject: str | None = None
    value: float | None = None
    detail: str | None = None
    wall: float | None = None  # the wall clock at the event, for display; None: t


@dataclass(frozen=True)
class ModelInterval:
    model: str
    dt_s: float
    inferences: int
    compute_ns: int
    energy_mj: float | None  # None: no power reading in this interval, the energy is unknown


def input_power_mw(sample: Sample) -> int | None:
    """The module's input power: a known input rail, else the sum of all rails, else None."""
    for name in INPUT_RAILS:
        if name in sample.power_mw:
            return sample.power_mw[name].now_mw
    if not sample.power_mw:
        return None
    return sum(r.now_mw for r in sample.power_mw.values())


@dataclass
class EnergyAttributor:
    last_t: float | None = None
    last_counts: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    energy_mj: dict[str, float] = field(default_factory=dict)  # cumulative, since start
    inferences: dict[str, int] = field(default_factory=dict)

    def update(self, t: float, power_mw: int | None,
               activity: Mapping[tuple[str, str], tuple[int, int]]) -> list[ModelInterval]:
        deltas: dict[str, tuple[int, int]] = {}
        for key, (count, ns) in activity.items():
            # A counter seen for the first time after the first sample started since the previous one (a version
            # loaded): all it counted is new. At the first sample its past is from before this service started.
            c0, ns0 = self.last_counts.get(key, (count, ns) if self.last_t is None else (0, 0))
            if count < c0 or ns < ns0:  # the version was reloaded in place: its counters restarted
                c0, ns0 = 0, 0
            if count > c0:
                model = key[0]
                done, spent = deltas.get(model, (0, 0))
                deltas[model] = (done + count - c0, spent + ns - ns0)
        self.last_counts = dict(activity)
        dt = t - self.last_t if self.last_t is not None else 0.0
        self.last_t = t
        if not deltas or dt <= 0:
            return []
        total_ns = sum(ns for _, ns in deltas.values())
        out = []
        for model, (count, ns) in deltas.items():
            if power_mw is None:  # unknown energy: these inferences count in neither side of the ratio
                out.append(ModelInterval(model, dt, count, ns, None))
                continue
            share = ns / total_ns if total_ns > 0 else 1 / len(deltas)
            energy = power_mw * dt * share  # mW * s = mJ
            self.energy_mj[model] = self.energy_mj.get(model, 0.0) + energy
            self.inferences[model] = self.inferences.get(model, 0) + count
            out.append(ModelInterval(model, dt, count, ns, energy))
        return out

    def per_inference_mj(self) -> dict[str, float]:
        return {m: self.energy_mj[m] / n for m, n in self.inferences.items() if n > 0}


@dataclass
class ThrottleDetector:
    """Turns frequency caps and temperatures over trip points into enter/leave events; counts entries."""

    over_temp_c: float
    active: set[str] = field(default_factory=set)
    counts: dict[str, int] = field(default_factory=dict)  # "throttle:gpu", "over_temperature:cpu" -> entries

    def _edge(self, key: str, on: bool, t: float, value: float, detail: str) -> list[Event]:
        kind, subject = key.split(":", 1)
        if on and key not in self.active:
            self.active.add(key)
            self.counts[key] = self.counts.get(key, 0) + 1
            return [Event(t, kind, subject, value, detail)]
        if not on and key in self.active:
            self.active.discard(key)
            return [Event(t, f"{kind}_end", subject, value, detail)]
        return []

    def update(self, sample: Sample, t: float | None = None) -> list[Event]:
        """Events at ``t`` (device elapsed time; default the sample's own time)."""
        t = sample.t if t is None else t
        events: list[Event] = []
        for domain, (cap, hw_max) in sample.freq_caps.items():
            events += self._edge(f"throttle:{domain}", cap < hw_max, t, float(cap),
                                 f"frequency capped at {cap} MHz of {hw_max} MHz")
        for sensor, temp in sample.temps_c.items():
            if sensor.upper().startswith("PMIC"):
                continue  # PMIC-Die reads a constant 100 C on JP4 modules (docs/jetson.md §4)
            trip = sample.trips_c.get(sensor, self.over_temp_c)
            events += self._edge(f"over_temperature:{sensor}", temp >= trip, t, temp,
                                 f"{temp:.1f} C, trip point {trip:.1f} C")
        return events

"""Fleet simulation benchmark (issue #11 §7): N real `edged serve` daemons, one mosquitto, one nginx-served TUF
repository, one client hammering every device; the suite's flow (tests/ota/test_ota_fleet_sim.py `run_rollout`:
a good model in waves 10 % → 50 % → 100 % with `edged fleet promote`, then a bad one that halts in the first
wave) with a bundle of about 50 MB.

Measured in one run, side by side: each device's update time (MQTT nudge → its retained status says active),
the p99 of inference on a wave's devices while that wave updates against the same devices before any update,
each wave's peak RSS while staging (VmHWM, reset before the nudge), failed inferences, and the bytes fetched
again after a download of the same bundle from the same nginx is cut at 50 %.

Usage: PYTHONPATH=. .venv/bin/python scripts/bench_fleet.py [--devices 20] [--hidden 170000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edged.ota._fetcher import ResumableFetcher  # noqa: E402
from edged.ota.fleet import FleetRepository  # noqa: E402
from tests.integration.edged_daemon import proc_status_kib  # noqa: E402
from tests.ota.conftest import MODEL  # noqa: E402
from tests.ota.fleet_sim import Fleet, Sample, in_wave  # noqa: E402
from tests.ota.test_ota_fleet_sim import run_rollout  # noqa: E402


def p99_ms(values: list[float]) -> float:
    return round(float(np.percentile(values, 99)) * 1e3, 2) if values else float("nan")


class Probe:
    """Wraps `Fleet.nudge_all` to reset every daemon's VmHWM before each wave and remember the nudge times."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.nudges: list[tuple[float, float]] = []  # (wall, monotonic)
        self.peaks: list[dict[str, int]] = []
        self._nudge = fleet.nudge_all
        fleet.nudge_all = self.nudge_all  # type: ignore[method-assign]

    def nudge_all(self) -> float:
        if self.nudges:
            self.peaks.append(self._read_peaks())
        for daemon in self.fleet.daemons.values():
            Path(f"/proc/{daemon.pid}/clear_refs").write_text("5")  # VmHWM back to the current RSS
        self.nudges.append((time.time(), time.monotonic()))
        return self._nudge()

    def _read_peaks(self) -> dict[str, int]:
        return {d: proc_status_kib(p.pid, "VmHWM") for d, p in self.fleet.daemons.items()}

    def finish(self) -> None:
        self.peaks.append(self._read_peaks())


def cut_at_half(fleet: Fleet, target: str, work: Path) -> dict[str, int]:
    info = FleetRepository(fleet.repo).targets()[target]
    url = f"{fleet.nginx.url}/targets/models/{MODEL}/{info['sha256']}.2.tar"
    fetcher = ResumableFetcher(work / "partial", f"{fleet.nginx.url}/targets/")
    got = 0
    for chunk in fetcher.fetch(url):  # abandoned at half: the partial file stays, as after a cut connection
        got += len(chunk)
        if got >= info["length"] // 2:
            break
    first = fetcher.progress.fetched_bytes
    for _ in fetcher.fetch(url):
        pass
    return {"length": int(info["length"]), "before_cut": first, "after_cut": fetcher.progress.fetched_bytes - first}


def wave_report(fleet: Fleet, probe: Probe, samples: list[Sample], index: int, percent: int,
                docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    wall, mono = probe.nudges[index]
    members = {d for d in fleet.ids if in_wave(d, percent)
               and not any(in_wave(d, p) for p in (10, 50)[:index])}
    update_s = sorted(round(docs[d]["updated_at"] - wall, 2) for d in members)
    end = mono + update_s[-1]  # the wave's last device became active
    before = [s.latency_s for s in samples if s.device in members and s.began < probe.nudges[0][1]]
    during = [s.latency_s for s in samples if s.device in members and mono <= s.began < end]
    peaks = probe.peaks[index]
    return {"percent": percent, "new_devices": len(members), "update_s_min": update_s[0],
            "update_s_max": update_s[-1], "p99_before_ms": p99_ms(before), "p99_during_ms": p99_ms(during),
            "requests_during": len(during), "peak_rss_staging_mib_max": round(max(peaks[d] for d in members) / 1024, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=170_000, help="hidden width: 170000 makes a 50 MB ONNX")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        fleet = Fleet(work, args.devices, hidden=args.hidden)
        probe = Probe(fleet)
        active_at: dict[str, float] = {}
        try:
            rss_idle = {d: proc_status_kib(p.pid, "VmRSS") for d, p in fleet.daemons.items()}
            fleet.hammer.thread.start()
            fleet.hammer_until_each_answered(20)
            report = run_rollout(fleet)
            probe.finish()
            fleet.hammer_until_each_answered(5)
            fleet.hammer.stop.set()
            fleet.hammer.thread.join(60)
            for device in fleet.ids:  # when the good model became active, from each device's own history
                history = fleet.daemons[device].client().ota("history")["history"]
                active_at[device] = next(h["changed_at"] for h in history
                                         if h["target"].endswith("/2.tar") and h["state"] == "active")
            cut = cut_at_half(fleet, "models/mlp/2.tar", work)
        finally:
            fleet.close()
    docs = {d: {"updated_at": t} for d, t in active_at.items()}
    samples = fleet.hammer.samples
    result = {
        "devices": args.devices, "bundle_bytes": cut["length"], "daemons_start_s": round(fleet.started_s, 1),
        "rss_idle_mib_max": round(max(rss_idle.values()) / 1024, 1),
        "waves": [wave_report(fleet, probe, samples, i, w["percent"], docs) for i, w in enumerate(report["waves"])],
        "bad_model_refused_by": report["bad_refused_by"], "requests": len(samples),
        "failed_requests": len(fleet.hammer.failures), "refetched_after_50pct_cut_bytes": cut["after_cut"],
        "fetched_before_cut_bytes": cut["before_cut"],
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

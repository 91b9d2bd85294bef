"""The fleet simulation of issue #11 §7, in the suite: real daemons, one mosquitto, one nginx, a client hammering
every device. A good model rolls out in waves 10 % → 50 % → 100 % with `edged fleet promote`; a bad one halts
in the first wave (promote refuses) with the other devices untouched; not one inference fails.

The suite runs FLEET_SIZE = 10 daemons (waves of 1, 4 and 5 devices): 20 took 75 s on the shared 2-core build
machine when it was quiet and 154 s under the other builds' load, past the suite's 90 s. scripts/bench_fleet.py
runs this same flow (`run_rollout`, every assertion) with 20 daemons and a 50 MB bundle and records the numbers
in docs/benchmarks.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edged.ota.fleet import FleetRepository
from tests.ota.conftest import vectors_for
from tests.ota.fleet_sim import WAVES, Fleet, in_wave

FLEET_SIZE = 10


def _settled(target: str, percent: int, device_state: str) -> Any:
    def check(doc: dict[str, Any]) -> bool:
        if in_wave(doc["device_id"], percent):
            return bool(doc.get("target") == target and doc.get("state") == device_state)
        return "not in this wave" in doc.get("skipped", {}).get(target, "")
    return check


def run_rollout(fleet: Fleet) -> dict[str, Any]:
    """The whole §7 flow; asserts every step and returns what it saw (for the benchmark's report)."""
    report: dict[str, Any] = {"waves": []}
    good = fleet.add_model(2, seed=2, vectors=vectors_for(2, hidden=fleet.hidden), percent=WAVES[0])
    for percent in WAVES:
        if percent != WAVES[0]:
            promoted = fleet.promote(good, percent)
            assert promoted.returncode == 0, promoted.stdout + promoted.stderr
        since = fleet.nudge_all()
        docs = fleet.wait_checked(since, _settled(good, percent, "active"), timeout_s=120)
        updated = sorted(d for d in fleet.ids if docs[d].get("version") == 2 and docs[d]["state"] == "active")
        assert updated == sorted(d for d in fleet.ids if in_wave(d, percent)), docs
        report["waves"].append({"percent": percent, "devices": len(updated), "settled_s": _since(docs, since)})
    bad = fleet.add_model(3, seed=3, vectors=vectors_for(3, offset=1.0, hidden=fleet.hidden), percent=WAVES[0])
    since = fleet.nudge_all()
    docs = fleet.wait_checked(since, _settled(bad, WAVES[0], "refused"), timeout_s=120)
    first_wave = sorted(d for d in fleet.ids if in_wave(d, WAVES[0]))
    assert all("test vector 0" in docs[d]["reason"] for d in first_wave), {d: docs[d]["reason"] for d in first_wave}
    refused = fleet.promote(bad, WAVES[1])
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"{len(first_wave)} devices failed it" in refused.stderr and ", ".join(first_wave) in refused.stdout
    assert FleetRepository(fleet.repo).targets()[bad]["percent"] == WAVES[0]
    others = [d for d in fleet.ids if d not in first_wave]
    assert all(docs[d]["target"] == good and docs[d]["state"] == "active" for d in others), docs
    report["bad_refused_by"] = first_wave
    return report


def _since(docs: dict[str, dict[str, Any]], since: float) -> float:
    return max(doc.get("changed_at") or since for doc in docs.values()) - since


@pytest.mark.slow
def test_a_fleet_rolls_out_in_waves_halts_a_bad_model_in_the_first_and_no_inference_fails(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, FLEET_SIZE)
    try:
        fleet.hammer.thread.start()
        fleet.hammer_until_each_answered(3)
        run_rollout(fleet)
        fleet.hammer_until_each_answered(3)
        fleet.hammer.stop.set()
        fleet.hammer.thread.join(60)
        assert fleet.hammer.failures == []
        assert fleet.hammer.served() == dict.fromkeys(fleet.ids, "2")  # every device ends on the good model
    finally:
        fleet.close()

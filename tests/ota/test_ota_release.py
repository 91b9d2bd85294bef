"""Daemon releases on the device's side, against nginx: the agent verifies a release target and hands it off
(tarball, the metadata it verified, a request) for edged-update, reads edged-update's outcome into its status,
never retries a release that failed, skips releases for other platforms, refuses to judge expiry with a clock
that is obviously wrong, and keeps serving throughout. The self-test edged-update waits for is checked here too.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from edged.clock import ManualClock
from edged.ota import ota_metrics
from edged.ota._release import PLATFORM
from edged.ota.fleet import FleetRepository
from tests.ota.conftest import Device, Nginx, model_folder, vectors_for

YEAR_2100 = 4_102_444_800.0


def release_tarball(where: Path, version: str, platform: str = PLATFORM) -> Path:
    """The part of a build-tarball tarball the device side reads: its manifest (the rest is edged-update's)."""
    path = where / f"edged-{version}-{platform}.tar.gz"
    manifest = json.dumps({"version": version, "platform": platform, "python": "3.12", "extras": []}).encode()
    with tarfile.open(path, "w:gz") as tar:
        members = ((f"edged-{version}/manifest.json", manifest), (f"edged-{version}/install.sh", b"#!/bin/sh\n"))
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def releasing(tmp_path: Path, nginx: Nginx, fleet: FleetRepository) -> Device:
    made = Device(tmp_path, nginx.url, fleet.metadata_dir / "1.root.json", release_work_dir=str(tmp_path / "update"))
    yield made  # type: ignore[misc]
    made.close()


def write_outcome(device: Device, doc: dict[str, object]) -> None:
    """What edged-update writes in its root-owned work folder when it is done."""
    folder = Path(device.config.release_work_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "outcome.json").write_text(json.dumps(doc))


def test_a_release_is_verified_and_handed_off_with_the_metadata_it_was_verified_with(
        releasing: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    tarball = release_tarball(tmp_path, "0.9.0")
    name = fleet.add_release(tarball, percent=100)
    assert name == f"releases/{PLATFORM}/0.9.0.tar.gz"
    status = releasing.agent.check()
    assert status["release"]["state"] == "handed_off", status["release"]
    assert status["release"]["version"] == "0.9.0" and status["release"]["target"] == name
    handoff = releasing.state_dir / "ota" / "release"
    assert (handoff / "release.tar.gz").read_bytes() == tarball.read_bytes()
    request = json.loads((handoff / "request.json").read_text())
    assert request == {"target": name, "sha256": hashlib.sha256(tarball.read_bytes()).hexdigest(),
                       "version": "0.9.0"}
    assert sorted(p.name for p in (handoff / "metadata").iterdir()) == \
        ["root.json", "snapshot.json", "targets.json", "timestamp.json"]
    assert not (handoff.parent / "release.incoming").exists()  # one rename: complete or absent
    assert releasing.agent.check()["release"]["state"] == "handed_off"  # no second hand-off while it waits
    assert releasing.served_version() == "1"  # the daemon kept serving
    from edged.cli.ota import describe

    assert any(line.startswith(f"release   {status['release']['running']}: handed_off 0.9.0: verified")
               for line in describe(status)), describe(status)


def test_edged_updates_outcome_reaches_the_status_and_a_failed_release_is_never_retried(
        releasing: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    tarball = release_tarball(tmp_path, "0.9.0")
    name = fleet.add_release(tarball)
    releasing.agent.check()
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    write_outcome(releasing, {"sha256": "someone-else", "state": "active", "reason": "not this release"})
    releasing.agent.release.poll()
    assert releasing.agent.status()["release"]["state"] == "handed_off"  # an outcome for another release
    write_outcome(releasing, {"sha256": digest, "state": "installing", "reason": "installing 0.9.0"})
    releasing.agent.release.poll()
    assert releasing.agent.status()["release"]["state"] == "installing"
    reason = "edged 0.9.0 did not become READY within release_health_s 5 s: rolled back to 0.1.0"
    write_outcome(releasing, {"sha256": digest, "state": "rolled_back", "reason": reason})
    restarted = releasing.new_agent()  # the previous release serving again reads it at its start
    restarted.resume()
    status = restarted.status()["release"]
    assert status["state"] == "rolled_back" and status["reason"] == reason
    assert 'edged_ota_release_state{state="rolled_back"} 1' in ota_metrics(restarted.status())
    assert not (releasing.state_dir / "ota" / "release").exists()
    again = restarted.check()["release"]
    assert again["state"] == "rolled_back"
    assert again["skipped"][name].startswith("known bad: edged 0.9.0 did not become READY")


def test_a_release_for_another_platform_or_an_older_version_is_not_taken(
        releasing: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    other = fleet.add_release(release_tarball(tmp_path, "0.9.0", platform="linux_riscv64"))
    fleet.add_release(release_tarball(tmp_path, "0.0.9"))
    status = releasing.agent.check()["release"]
    assert status["state"] == "idle"
    assert status["skipped"] == {other: f"incompatible: built for linux_riscv64, this device is {PLATFORM}"}


def test_a_wave_that_excludes_the_device_says_so(releasing: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    name = fleet.add_release(release_tarball(tmp_path, "0.9.0"), percent=0)
    status = releasing.agent.check()["release"]
    assert status["state"] == "idle"
    assert status["skipped"][name].startswith("not in this wave")


@pytest.mark.parametrize(("wall", "reads"), [(0.0, "1970-01-01"), (YEAR_2100, "2100-01-01")])
def test_a_clock_that_is_obviously_wrong_refuses_with_reason_clock_and_the_daemon_keeps_serving(
        releasing: Device, fleet: FleetRepository, tmp_path: Path, wall: float, reads: str) -> None:
    fleet.add_model(model_folder(tmp_path / "src", 2, seed=2), 2, vectors_for(2))
    fleet.add_release(release_tarball(tmp_path, "0.9.0"))
    agent = releasing.new_agent()
    agent.clock = ManualClock(wall=wall)
    status = agent.check()
    assert status["last_check"]["outcome"] == "refused"
    assert status["last_check"]["reason"].startswith(f"clock: the device clock reads {reads}")
    assert status["state"] == "idle" and status["release"]["state"] == "idle"  # nothing taken
    assert releasing.served_version() == "1"
    agent.clock = ManualClock(wall=YEAR_2100 - 74 * 365 * 86400)  # 2026: the clock was set
    assert agent.check()["release"]["state"] == "handed_off"


def test_the_self_test_runs_warm_up_or_the_test_vectors_a_version_came_with(
        releasing: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    assert releasing.agent.self_test() == {"ok": True, "models": {"mlp/1": "ok: its warm-up answered"}}
    fleet.add_model(model_folder(tmp_path / "src", 2, seed=2), 2, vectors_for(2))
    assert releasing.agent.check()["state"] == "active"
    report = releasing.agent.self_test()
    assert report["models"]["mlp/2"] == "ok: its test vectors match", report
    kept = releasing.state_dir / "ota" / "vectors" / "mlp.2.json"
    kept.write_text(json.dumps([{**v, "outputs": [{**v["outputs"][0], "data": [9.0] * 10}]}
                                for v in json.loads(kept.read_text())]))  # numbers this version does not give
    report = releasing.agent.self_test()
    assert report["ok"] is False
    assert report["models"]["mlp/2"].startswith("failed: test vector 0: output 'output' differs"), report


def test_fleet_add_release_signs_a_tarball_and_refuses_what_is_not_one(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.integration.edged_daemon import daemon_environment

    def edged(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "edged", *args], capture_output=True, text=True, timeout=120,
                              env=daemon_environment(), check=False)

    repo = str(tmp_path / "fleet")
    assert edged("fleet", "init", repo).returncode == 0
    tarball = release_tarball(tmp_path, "0.9.0")
    added = edged("fleet", "add-release", repo, str(tarball), "--percent", "10", "--compat", "jetpack=6.2")
    assert added.returncode == 0, added.stderr
    name = f"releases/{PLATFORM}/0.9.0.tar.gz"
    listed = json.loads(edged("fleet", "targets", repo).stdout)[name]
    assert {k: listed[k] for k in ("kind", "version", "platform", "percent", "compat")} == {
        "kind": "release", "version": "0.9.0", "platform": PLATFORM, "percent": 10, "compat": {"jetpack": "6.2"}}
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    assert (tmp_path / "fleet" / "targets" / "releases" / PLATFORM / f"{digest}.0.9.0.tar.gz").is_file()
    (tmp_path / "model.tar.gz").write_bytes(b"not a tarball")
    bad = edged("fleet", "add-release", repo, str(tmp_path / "model.tar.gz"))
    assert bad.returncode == 1 and "not a release tarball of packaging/build-tarball" in bad.stderr
    missing = edged("fleet", "add-release", repo, str(tmp_path / "nothing.tar.gz"))
    assert missing.returncode != 0 and "is not a file" in missing.stderr


def test_a_release_download_cut_by_the_network_resumes_after_a_restart_and_is_not_marked_bad(
        releasing: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    tarball = release_tarball(tmp_path, "0.9.0")
    fleet.add_release(tarball)
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    stored = fleet.targets_dir / "releases" / PLATFORM / f"{digest}.0.9.0.tar.gz"
    hidden = stored.with_name("away")
    stored.rename(hidden)  # the host answers 404 for the target: the network's fault, not the release's
    status = releasing.agent.check()["release"]
    assert status["state"] == "downloading" and "network" in status["reason"], status
    hidden.rename(stored)
    restarted = releasing.new_agent()  # a kill -9 here: the record on disk says downloading
    restarted.resume()
    assert restarted.check()["release"]["state"] == "handed_off"
    assert restarted.release.store.bad == {}


def test_a_hand_off_nobody_takes_is_refused_so_model_updates_go_on(
        releasing: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    fleet.add_release(release_tarball(tmp_path, "0.9.0"))
    assert releasing.agent.check()["release"]["state"] == "handed_off"
    fleet.add_model(model_folder(tmp_path / "src", 2, seed=2), 2, vectors_for(2))
    assert releasing.agent.check()["state"] == "idle"  # models wait while a release is with edged-update
    state_file = releasing.state_dir / "ota" / "release-state.json"
    doc = json.loads(state_file.read_text())
    doc["current"]["changed_at"] -= 3600  # an hour ago, and edged-update never started (no .path unit)
    state_file.write_text(json.dumps(doc))
    restarted = releasing.new_agent()
    status = restarted.check()
    assert status["release"]["state"] == "refused"
    assert "edged-update did not take the hand-off" in status["release"]["reason"]
    assert status["state"] == "active" and releasing.served_version() == "2"

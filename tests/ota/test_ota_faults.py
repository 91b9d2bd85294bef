"""Faults of the way, not of the target (issue #11 §6): a server that trickles bytes and a state directory with no
room. Each is refused with its reason in status, nothing of it is left half-installed, the previous version
keeps serving, and the target is not remembered as bad (the next check tries again)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from edged.ota.fleet import FleetRepository
from tests.ota.conftest import Device, Nginx, model_folder, vectors_for


@pytest.fixture
def trickling(tmp_path: Path, fleet: FleetRepository) -> Iterator[Nginx]:
    """nginx sending targets at 2 KiB/s (metadata at full speed): a slow-retrieval attack or a dying link."""
    server = Nginx(fleet.path, tmp_path / "nginx", locations="location /targets/ { limit_rate 2k; }")
    yield server
    server.stop()


def test_a_trickling_download_is_given_up_below_the_minimum_rate_and_the_old_version_serves(
        tmp_path: Path, trickling: Nginx, fleet: FleetRepository) -> None:
    device = Device(tmp_path, trickling.url, fleet.metadata_dir / "1.root.json", min_bytes_per_s=50_000,
                    rate_window_s=1.0)
    try:
        fleet.add_model(model_folder(tmp_path / "src", 2, seed=2), 2, vectors_for(2))
        status = device.agent.check()
        assert status["state"] == "refused", status
        assert "slow retrieval" in status["reason"] and "below [ota] min_bytes_per_s 50000" in status["reason"]
        assert 0 < status["download"]["received_bytes"] < status["download"]["total_bytes"]
        assert device.served_version() == "1"
        assert status["bad_targets"] == 0  # the way was slow, not the target: the next check tries again
        assert "slow retrieval" in device.agent.check()["reason"]
    finally:
        device.close()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs where the device's repository and state directory live."""
    mount = tmp_path / "device"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_an_update_that_does_not_fit_the_state_directory_is_refused_for_disk_and_nothing_is_left(
        tmp_path: Path, small_disk: Path, nginx: Nginx, fleet: FleetRepository) -> None:
    device = Device(tmp_path, nginx.url, fleet.metadata_dir / "1.root.json")
    try:
        before = sorted(str(p.relative_to(small_disk)) for p in (small_disk / "models").rglob("*"))
        fleet.add_model(model_folder(tmp_path / "src", 2, seed=2, hidden=2048), 2, vectors_for(2, hidden=2048))
        status = device.agent.check()
        assert status["state"] == "refused", status
        assert status["reason"].startswith("disk: the update needs"), status["reason"]
        assert device.served_version() == "1"
        assert sorted(str(p.relative_to(small_disk)) for p in (small_disk / "models").rglob("*")) == before
        ota = small_disk / "state" / "ota"
        assert not (ota / "staging").exists() and not list((ota / "partial").glob("*"))
        assert status["bad_targets"] == 0
    finally:
        device.close()


def test_a_check_on_a_full_state_directory_is_refused_for_disk_not_an_internal_error(
        tmp_path: Path, small_disk: Path, nginx: Nginx, fleet: FleetRepository) -> None:
    """A review filled the state directory to the last byte: the check died inside python-tuf's Updater (it writes
    the trusted root as it starts) with a bare ENOSPC, and the status kept the last check's outcome."""
    device = Device(tmp_path, nginx.url, fleet.metadata_dir / "1.root.json")
    filler = small_disk / "filler"
    try:
        fleet.add_model(model_folder(tmp_path / "src", 2, seed=2), 2, vectors_for(2))
        with contextlib.suppress(OSError), filler.open("wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        status = device.agent.check()
        assert status["last_check"]["outcome"] == "refused", status
        assert "disk: no space left" in status["last_check"]["reason"], status["last_check"]
        assert device.served_version() == "1"
        filler.unlink()
        again = device.agent.check()  # the metadata cache was not left torn by the failed write
        assert again["last_check"]["outcome"] == "ok", again["last_check"]
        assert again["state"] == "refused" and again["reason"].startswith("disk: the update needs"), again
        assert again["bad_targets"] == 0
    finally:
        filler.unlink(missing_ok=True)
        device.close()


def test_rate_settings_are_checked_and_a_minimum_above_the_cap_is_refused(tmp_path: Path) -> None:
    from edged.config import ModelsConfig, OtaConfig, parse_config
    from edged.engine import InferenceService
    from edged.errors import ConfigError
    from edged.ota import OtaAgent

    with pytest.raises(ConfigError, match=r"ota\.rate_window_s: expected a positive number"):
        parse_config("[ota]\nrate_window_s = 0\n")
    with pytest.raises(ConfigError, match=r"ota\.min_bytes_per_s: expected zero or a positive number"):
        parse_config("[ota]\nmin_bytes_per_s = -5\n")
    config = OtaConfig(enabled=True, repository_url="http://127.0.0.1:1", max_bytes_per_s=500, min_bytes_per_s=1000)
    service = InferenceService(tmp_path / "models", ModelsConfig())
    with pytest.raises(ConfigError, match="min_bytes_per_s: 1000 is above max_bytes_per_s 500"):
        OtaAgent(config, service, tmp_path / "models", tmp_path / "state")

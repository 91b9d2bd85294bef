"""Model updates end to end against nginx: the good path and every attack, each refused with its reason while
version 1 keeps serving."""

from __future__ import annotations

from pathlib import Path

from edged.ota.fleet import FleetRepository
from tests.ota.conftest import Device, model_folder, vectors_for


def _add(fleet: FleetRepository, tmp: Path, version: int = 2, seed: int = 2, **kwargs: object) -> str:
    folder = model_folder(tmp / f"src{version}-{seed}", version, seed)
    vectors = kwargs.pop("vectors", None) or vectors_for(seed)
    return fleet.add_model(folder, version, vectors, **kwargs)  # type: ignore[arg-type]


def test_a_signed_model_update_is_downloaded_tested_and_served(device: Device, fleet: FleetRepository,
                                                               tmp_path: Path) -> None:
    assert device.served_version() == "1"
    name = _add(fleet, tmp_path)
    status = device.agent.check()
    assert status["state"] == "active", status
    assert status["target"] == name and status["previous_version"] == 1
    assert device.served_version() == "2"
    assert status["device_id_source"] == "machine-id"
    assert sorted(p.name for p in (device.repository / "mlp").iterdir()) == ["1", "2", "config.pbtxt"]


def test_an_update_that_cannot_fit_beside_the_served_version_is_refused_and_evicts_nothing(
        tmp_path: Path, nginx: object, fleet: FleetRepository) -> None:
    from edged.config import MemoryConfig
    from edged.engine.memory_governor import MemoryGovernor

    # 18 MB of weights: a load's peak is estimated at 3 x the file (54 MB), which fits 60 MB alone; once loaded
    # the version is charged at least its 18 MB of weights, so a second copy's peak cannot fit beside it
    hidden = 60_000
    memory = MemoryGovernor(MemoryConfig(budget_mb=60.0, policy="evict_lru", load_estimate_factor=3.0), None)
    device = Device(tmp_path, nginx.url, fleet.metadata_dir / "1.root.json", hidden=hidden,  # type: ignore[attr-defined]
                    memory=memory)
    fleet.add_model(model_folder(tmp_path / "src", 2, seed=2, hidden=hidden), 2, vectors_for(2, hidden=hidden))
    status = device.agent.check()
    assert status["state"] == "refused", status
    assert "memory budget" in status["reason"], status["reason"]
    assert device.served_version() == "1"  # the served version was not evicted to make room
    device.close()


def test_old_versions_beyond_keep_versions_are_removed(device: Device, fleet: FleetRepository,
                                                       tmp_path: Path) -> None:
    _add(fleet, tmp_path, version=2, seed=2)
    device.agent.check()
    _add(fleet, tmp_path, version=3, seed=3)
    assert device.agent.check()["state"] == "active"
    assert device.served_version() == "3"
    assert sorted(p.name for p in (device.repository / "mlp").iterdir()) == ["2", "3", "config.pbtxt"]


def test_a_stop_while_staging_leaves_the_update_staged_not_condemned(device: Device, fleet: FleetRepository,
                                                                    tmp_path: Path) -> None:
    """SIGTERM (the daemon's stop: OtaAgent.stop, then the engine refuses new loads) as the bundle is staged.
    Before, the staging load refused for the stop marked the genuine target bad for good on this device."""
    name = fleet.add_model(model_folder(tmp_path / "src", 2, seed=2), 2, vectors_for(2))

    def stop_at_staging(doc: dict[str, object]) -> None:
        if doc["state"] == "staged":
            device.agent.stop()
            device.service.stop_loading()

    device.agent.listeners.append(stop_at_staging)
    status = device.agent.check()
    assert status["state"] == "staged", status  # staged again, then switched, at the next start
    assert device.agent.history()["bad"] == {}
    assert name not in status["skipped"]
    assert device.served_version() == "1"

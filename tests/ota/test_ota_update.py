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

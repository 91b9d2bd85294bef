"""After the switch: the watch window rolls back a version that passed its vectors but fails under real
traffic; the operator can roll back; OTA-installed models come back after a restart."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from edged.config import ModelsConfig
from edged.engine import InferenceService, InferRequest
from edged.errors import InferenceFailed, UpdateRejected
from edged.ota.fleet import FleetRepository
from tests.ota.conftest import MODEL, Device, Nginx, model_folder, vectors_for, write_fragile_onnx


@pytest.fixture
def watched(tmp_path: Path, nginx: Nginx, fleet: FleetRepository) -> Device:
    return Device(tmp_path, nginx.url, fleet.metadata_dir / "1.root.json", watch_s=3600.0, min_requests=10,
                  max_error_rate=0.2)


def test_a_version_failing_under_traffic_in_the_watch_window_is_rolled_back(
        watched: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "src", 2, seed=2)
    write_fragile_onnx(folder / "2" / "model.onnx", seed=2)
    name = fleet.add_model(folder, 2, vectors_for(2))
    status = watched.agent.check()
    assert status["state"] == "watching", status
    assert watched.served_version() == "2"
    for _ in range(10):  # the field sends batches of two, which the test vectors never tried
        with pytest.raises(InferenceFailed):
            watched.service.infer(InferRequest(MODEL, {"input": np.ones((2, 64), np.float32)}))
    assert watched.agent.evaluate_watch() == "fail"
    status = watched.agent.status()
    assert status["state"] == "rolled_back"
    assert "error rate 90.9% over 11 requests in the watch window exceeds max_error_rate 20.0%" in status["reason"]
    assert watched.served_version() == "1"
    assert not (watched.repository / MODEL / "2").exists()
    assert "known bad" in watched.agent.check()["skipped"][name]
    watched.close()


def test_a_check_while_an_update_is_watched_starts_nothing(watched: Device, fleet: FleetRepository,
                                                          tmp_path: Path) -> None:
    """A review's `edged ota check` during the window: an internal error (watching -> activating), the same
    target downloaded and staged again, and the staging left behind."""
    name = fleet.add_model(model_folder(tmp_path / "src", 2, seed=2), 2, vectors_for(2))
    assert watched.agent.check()["state"] == "watching"
    fetched = watched.agent.status()["download"]["fetched_bytes"]
    staged = (watched.agent.work_dir / "staging").stat().st_mtime_ns  # kept until the window's verdict
    again = watched.agent.check()
    assert again["state"] == "watching" and again["last_check"]["outcome"] == "ok", again
    assert again["download"]["fetched_bytes"] - fetched < int(fleet.targets()[name]["length"])  # metadata only
    length = int(fleet.targets()[name]["length"])  # the target's progress, not the metadata fetched since
    assert (again["download"]["received_bytes"], again["download"]["total_bytes"]) == (length, length)
    assert (watched.agent.work_dir / "staging").stat().st_mtime_ns == staged  # not staged again
    assert watched.served_version() == "2"
    watched.close()


def test_the_watch_verdict_waits_for_a_check_or_rollback_in_progress(watched: Device, fleet: FleetRepository,
                                                                     tmp_path: Path) -> None:
    """The periodic verdict runs in an executor thread; it judged the window while an operator's rollback or a
    check was half done (without the agent's lock), so the two could record over each other."""
    fleet.add_model(model_folder(tmp_path / "src", 2, seed=2), 2, vectors_for(2))
    assert watched.agent.check()["state"] == "watching"
    verdicts: list[str] = []
    with watched.agent._lock:  # what a check or a rollback holds while it works
        judge = threading.Thread(target=lambda: verdicts.append(watched.agent.evaluate_watch()))
        judge.start()
        judge.join(0.5)
        assert judge.is_alive() and not verdicts, "the verdict went ahead beside a check in progress"
    judge.join(30)
    assert verdicts == ["wait"]
    watched.close()


def test_the_operator_rolls_back_an_active_update(device: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    fleet.add_model(model_folder(tmp_path / "src", 2, seed=2), 2, vectors_for(2))
    assert device.agent.check()["state"] == "active"
    assert device.agent.check()["installed"] == {MODEL: 2}
    assert device.agent.rollback()["state"] == "rolled_back"
    assert device.served_version() == "1"
    # version 1 did not come by OTA; before, the status (and the retained MQTT one) still said 2 was installed
    assert device.agent.status()["installed"] == {}
    with pytest.raises(UpdateRejected, match="nothing to roll back"):
        device.agent.rollback()


def test_the_operator_rolling_back_a_second_update_leaves_the_first_installed(
        device: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    fleet.add_model(model_folder(tmp_path / "src", 2, seed=2), 2, vectors_for(2))
    assert device.agent.check()["state"] == "active"
    fleet.add_model(model_folder(tmp_path / "src3", 3, seed=3), 3, vectors_for(3))
    assert device.agent.check()["installed"] == {MODEL: 3}
    assert device.agent.rollback()["installed"] == {MODEL: 2}
    assert device.served_version() == "2"


def test_a_rollback_restores_the_previous_config(device: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    before = (device.repository / MODEL / "config.pbtxt").read_text()
    folder = model_folder(tmp_path / "src", 2, seed=2, config=before.replace("max_batch_size: 8",
                                                                              "max_batch_size: 4"))
    fleet.add_model(folder, 2, vectors_for(2))
    device.agent.check()
    assert device.service.model_config(MODEL).max_batch_size == 4  # the bundle's config took effect
    device.agent.rollback()
    assert (device.repository / MODEL / "config.pbtxt").read_text() == before
    assert device.service.model_config(MODEL).max_batch_size == 8


def test_ota_installed_models_come_back_after_a_restart_in_explicit_mode(
        device: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    fleet.add_model(model_folder(tmp_path / "src", 2, seed=2), 2, vectors_for(2))
    assert device.agent.check()["state"] == "active"
    device.service.close()
    # explicit mode with no startup models: only OTA's record brings the model back
    device.service = InferenceService(device.repository, ModelsConfig(control_mode="explicit"))
    device.service.start()
    assert device.service.model_names() == []
    device.agent = device.new_agent()
    device.agent.resume()
    assert device.served_version() == "2"


def test_a_rollback_restores_the_previous_labels_and_drops_the_ones_the_update_added(
        device: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    served = device.repository / MODEL
    (served / "labels.txt").write_text("cat\ndog\n")
    folder = model_folder(tmp_path / "src", 2, seed=2)
    (folder / "labels.txt").write_text("cat\ndog\nfox\n")
    (folder / "regions.txt").write_text("north\n")
    fleet.add_model(folder, 2, vectors_for(2))
    assert device.agent.check()["state"] == "active"
    assert (served / "labels.txt").read_text() == "cat\ndog\nfox\n"  # the bundle's labels came with the switch
    assert device.agent.rollback()["state"] == "rolled_back"
    assert (served / "labels.txt").read_text() == "cat\ndog\n"
    assert sorted(p.name for p in served.iterdir()) == ["1", "config.pbtxt", "labels.txt"]
    assert device.served_version() == "1"

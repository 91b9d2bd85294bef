"""OTA over MQTT with a real mosquitto and a real daemon: the nudge topic starts a check, and the retained
``edged/{device_id}/ota/status`` follows the update to active."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from edged.ota.fleet import FleetRepository
from tests.integration.edged_daemon import daemon_environment, start_daemon
from tests.mqtt.conftest import Broker, Subscriber, wait_until
from tests.ota.conftest import Nginx, model_folder, vectors_for


def _edged(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edged", *args], capture_output=True, text=True, timeout=120,
                          env=daemon_environment(), check=False)


def test_promote_counts_the_failures_devices_reported_on_the_broker(tmp_path: Path, fleet: FleetRepository) -> None:
    broker = Broker(tmp_path / "broker", persistence=False)
    broker.start()
    name = fleet.add_model(model_folder(tmp_path / "src", 2, seed=2), 2, vectors_for(2), percent=10)
    reporter = paho.Client(CallbackAPIVersion.VERSION2, client_id="devices")
    reporter.connect("127.0.0.1", broker.port)
    reporter.loop_start()
    try:
        reports = {"cam-1": "rolled_back", "cam-2": "refused", "cam-3": "active"}
        for device, state in reports.items():  # what each device's agent left retained
            doc = {"device_id": device, "state": state, "target": name, "reason": f"{state} in the test"}
            reporter.publish(f"edged/{device}/ota/status", json.dumps(doc), qos=1, retain=True).wait_for_publish(10)
        refused = _edged("fleet", "promote", str(fleet.path), name, "--percent", "50", "--broker", broker.url,
                         "--max-failures", "1")
        assert refused.returncode == 1, refused.stdout
        assert "cam-1, cam-2" in refused.stdout and "2 devices failed it" in refused.stderr
        assert fleet.targets()[name]["percent"] == 10
        allowed = _edged("fleet", "promote", str(fleet.path), name, "--percent", "50", "--broker", broker.url,
                         "--max-failures", "2")
        assert allowed.returncode == 0, allowed.stderr
        assert fleet.targets()[name]["percent"] == 50
    finally:
        reporter.loop_stop()
        reporter.disconnect()
        broker.stop()


def test_a_nudge_on_ota_check_installs_the_update_and_the_retained_status_says_active(
        tmp_path: Path, nginx: Nginx, fleet: FleetRepository) -> None:
    broker = Broker(tmp_path / "broker", persistence=False)
    broker.start()
    models = tmp_path / "device-models"
    model_folder(models, 1, seed=1)
    config = f"""[telemetry]
source = "off"
[models]
repository = "{models}"
[mqtt]
broker = "{broker.url}"
device_id = "cam-7"
[ota]
enabled = true
repository_url = "{nginx.url}"
root_file = "{fleet.metadata_dir}/1.root.json"
check_interval_s = 86400
jitter_s = 86400
watch_s = 0
min_requests = 0
"""
    daemon = start_daemon(tmp_path / "daemon", config=config)
    watcher = Subscriber(broker.port, ["edged/cam-7/ota/status"], client_id="watcher")
    try:
        wait_until(lambda: daemon.client().status()["mqtt"]["connected"], 30, "the daemon's MQTT connection")
        fleet.add_model(model_folder(tmp_path / "src", 2, seed=2), 2, vectors_for(2))
        nudger = paho.Client(CallbackAPIVersion.VERSION2, client_id="operator")
        nudger.connect("127.0.0.1", broker.port)
        nudger.loop_start()
        nudger.publish("edged/cam-7/ota/check", b"", qos=1).wait_for_publish(10)

        def active() -> bool:
            with watcher.cond:
                docs = [json.loads(m.payload) for m in watcher.messages]
            return any(doc.get("state") == "active" and doc.get("version") == 2 for doc in docs)

        wait_until(active, 120, "a retained OTA status saying active")
        late = Subscriber(broker.port, ["edged/cam-7/ota/status"], client_id="late")  # a fleet tool subscribing later
        (first,) = late.wait_for(1, 10)
        assert first.retain and json.loads(first.payload)["state"] == "active"
        late.close()
        listed = _edged("fleet", "status", "--broker", broker.url)
        assert listed.returncode == 0, listed.stderr
        assert "cam-7" in listed.stdout and "models/mlp/2.tar" in listed.stdout and "active" in listed.stdout
        nudger.loop_stop()
        nudger.disconnect()
    finally:
        watcher.close()
        daemon.stop()
        broker.stop()

"""OTA over MQTT with a real mosquitto and a real daemon: the nudge topic starts a check, and the retained
``edged/{device_id}/ota/status`` follows the update to active."""

from __future__ import annotations

import json
from pathlib import Path

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from edged.ota.fleet import FleetRepository
from tests.integration.edged_daemon import start_daemon
from tests.mqtt.conftest import Broker, Subscriber, wait_until
from tests.ota.conftest import Nginx, model_folder, vectors_for


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
        nudger.loop_stop()
        nudger.disconnect()
    finally:
        watcher.close()
        daemon.stop()
        broker.stop()

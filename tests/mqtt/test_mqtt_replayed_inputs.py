"""A broker that lost its state replays inputs edged answered: mosquitto restarted from an older snapshot of its
persistence file (what a kill -9 between two autosaves leaves) sends an answered input again as a first delivery.
edged answers it again (nothing is lost), and counts and logs the replay (see edged/mqtt/_msgid.py)."""

from __future__ import annotations

import logging
import shutil
import signal
from pathlib import Path

import orjson
import paho.mqtt.client as paho
import pytest
from conftest import Broker, Subscriber, wait_until
from paho.mqtt.enums import CallbackAPIVersion
from test_mqtt_outbox import frame

from edged.config import MqttConfig, PipelineConfig
from edged.engine import InferenceService
from edged.mqtt import MqttFrontEnd


def publish_one(broker: Broker, topic: str, payload: bytes) -> None:
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id="replay-sensor")
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        client.publish(topic, payload, 1).wait_for_publish(10)
    finally:
        client.loop_stop()
        client.disconnect()


def run_once(service: InferenceService, config: MqttConfig, broker: Broker, state: Path) -> tuple[list[str], dict]:
    """Start the broker and edged, take the results of whatever the broker delivers, stop both."""
    broker.start()
    results = Subscriber(broker.port, ["replay/+/out"])
    front = MqttFrontEnd(service, config, state, version="test")
    front.start()
    try:
        results.wait_for(1, 10)
        wait_until(lambda: front.status()["outbox"]["depth"] == 0, what="the outbox drained")
        status = front.status()
        metrics = front.prometheus_lines()
    finally:
        front.stop(5)
        results.close()
        broker.stop(signal.SIGKILL)
    ids = [orjson.loads(m.payload)["parameters"]["edged_message_id"] for m in results.messages]
    return ids, {**status, "metrics": metrics}


def test_an_input_replayed_by_a_broker_restored_from_an_old_snapshot_is_answered_and_counted(
        service: InferenceService, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    broker = Broker(tmp_path / "broker")
    config = MqttConfig(broker=broker.url, device_id="replay", reconnect_min_s=0.05, reconnect_max_s=0.5,
                        pipelines=(PipelineConfig(input="replay/+/in", model="tiny_mlp", output="replay/{1}/out",
                                                  qos=1),))
    state = tmp_path / "state"
    broker.start()
    front = MqttFrontEnd(service, config, state, version="test")
    front.start()
    wait_until(lambda: front.status()["subscribed"], what="edged's session subscribed")
    front.stop(5)
    publish_one(broker, "replay/a/in", frame(1))  # queued in edged's session while it is away
    broker.stop()  # SIGTERM: mosquitto saves its state; this file is the "old snapshot"
    snapshot = tmp_path / "snapshot.db"
    shutil.copy(broker.directory / "mosquitto.db", snapshot)

    first_ids, first = run_once(service, config, broker, state)
    assert first["inputs_replayed"] == 0
    assert "edged_mqtt_inputs_replayed_total 0" in first["metrics"]

    shutil.copy(snapshot, broker.directory / "mosquitto.db")  # the broker comes back without what it learnt since
    with caplog.at_level(logging.WARNING, logger="edged.mqtt"):
        second_ids, second = run_once(service, config, broker, state)
    assert len(first_ids) == 1 and len(second_ids) == 1, "the replayed input was not answered again"
    assert second["inputs_replayed"] == 1
    assert "edged_mqtt_inputs_replayed_total 1" in second["metrics"]
    assert second["drops"] == {} and second["errors"] == {}
    assert any("without the DUP flag" in r.getMessage() and "replay/a/in" in r.getMessage() for r in caplog.records)

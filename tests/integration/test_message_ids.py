"""``edged_message_id`` through a kill -9 of `edged serve`: one id per input however often it is redelivered,
and different ids for different inputs even when their payloads are identical."""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import orjson
import paho.mqtt.client as paho
import pytest
from integration.edged_daemon import DaemonProcess, start_daemon
from mqtt.conftest import Broker, Subscriber, wait_until
from paho.mqtt.enums import CallbackAPIVersion

from edged.protocol import encode_request

FLOOD = 3000
TWIN = "twin"


def frame(request_id: str, value: float = 0.5) -> bytes:
    body, _ = encode_request({"input": np.full((1, 64), value, np.float32)}, binary=False, request_id=request_id)
    return body


def pipeline_config(broker: Broker) -> str:
    return f"""
[telemetry]
source = "off"

[mqtt]
broker = "{broker.url}"
device_id = "ids"
reconnect_min_s = 0.05
reconnect_max_s = 0.5

[[mqtt.pipelines]]
input = "ids/+/in"
model = "tiny_mlp"
output = "ids/{{1}}/out"
qos = 1
"""


def message_ids(messages: list[paho.MQTTMessage]) -> dict[str, list[str]]:
    """Request id (a sequence number in the payload) -> the edged_message_id of each result, in arrival order."""
    seen: dict[str, list[str]] = {}
    for msg in messages:
        doc = orjson.loads(msg.payload)
        seen.setdefault(doc["id"], []).append(doc["parameters"]["edged_message_id"])
    return seen


@pytest.mark.slow
def test_every_redelivery_after_a_kill_9_carries_its_first_id_and_identical_payloads_get_two(
        tmp_path: Path) -> None:
    broker = Broker(tmp_path / "broker")
    broker.start()
    results = Subscriber(broker.port, ["ids/+/out"], client_id="ids-results", persistent=True)
    sensor = paho.Client(CallbackAPIVersion.VERSION2, client_id="ids-sensor")
    sensor.connect("127.0.0.1", broker.port)
    sensor.loop_start()
    daemon: DaemonProcess | None = None
    try:
        daemon = start_daemon(tmp_path / "edged", config=pipeline_config(broker))
        first = daemon.client()
        wait_until(lambda: first.status()["mqtt"]["subscribed"], 30, "edged subscribed")  # inputs reach it
        for _ in range(2):  # two different messages, byte for byte the same
            sensor.publish("ids/s0/in", frame(TWIN), 1).wait_for_publish(10)
        wait_until(lambda: len(message_ids(list(results.messages)).get(TWIN, [])) >= 2, 30, "both twins")
        for i in range(FLOOD):
            sensor.publish(f"ids/s{i % 3}/in", frame(f"m-{i}", i % 17 / 16), 1)
        wait_until(lambda: len(results.messages) >= FLOOD // 4, 120, "a quarter of the flood")
        daemon.process.send_signal(signal.SIGKILL)
        daemon.process.wait(10)
        at_kill = len(message_ids(list(results.messages)))
        daemon = start_daemon(tmp_path / "edged", config=pipeline_config(broker))
        wait_until(lambda: len(message_ids(list(results.messages))) >= FLOOD + 1, 240, "every input answered")
        second = daemon.client()
        wait_until(lambda: second.status()["mqtt"]["outbox"]["depth"] == 0, 60, "the outbox drained")
    finally:
        if daemon is not None:
            daemon.stop()
        sensor.loop_stop()
        results.close()
        broker.stop()
    seen = message_ids(list(results.messages))
    assert set(seen) == {TWIN} | {f"m-{i}" for i in range(FLOOD)}
    assert len(set(seen[TWIN])) == 2, f"identical payloads must get different ids, got {seen[TWIN]}"
    changed = {rid: ids for rid, ids in seen.items() if rid != TWIN and len(set(ids)) != 1}
    repeated = sum(len(ids) - 1 for ids in seen.values())
    print(f"{at_kill} inputs answered before the kill, {repeated} results delivered again after it")
    assert not changed, f"{len(changed)} inputs came back under a new id, e.g. {sorted(changed.items())[:3]}"
    every = [i for ids in seen.values() for i in set(ids)]
    assert len(every) == len(set(every)), "two inputs share an id"

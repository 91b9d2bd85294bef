"""A damaged outbox file (a power cut on an SD card, a truncated copy) does not stop edged from starting.

The file is a real outbox with stored results, then damaged on disk between runs as a field device damages it:
cut short, its header overwritten, or a page in the middle overwritten. The front end moves it (and its WAL)
aside, logs where to, starts with an empty outbox and answers requests through a real mosquitto.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from conftest import Broker, Subscriber, wait_until
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from test_mqtt_outbox import frame

from edged.config import MqttConfig, OutboxConfig
from edged.engine import InferenceService
from edged.mqtt import MqttFrontEnd
from edged.mqtt._message import Outbound
from edged.mqtt._metrics import Metrics
from edged.mqtt._outbox import Outbox
from edged.mqtt.frontend import OUTBOX_FILE


def stored_outbox(path: Path, count: int) -> None:
    """An outbox file holding ``count`` results never sent (no broker), its WAL checkpointed into it."""
    outbox = Outbox(path, OutboxConfig(), Metrics())
    outbox.start(lambda message: None)
    for i in range(count):
        outbox.put(Outbound("results/x", b"r" * 1000 + str(i).encode(), 1, message_id=f"id-{i}"))
    wait_until(lambda: outbox.depth == count, what="the results stored")
    outbox.stop(5)


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[:5000])
    elif how == "header":
        path.write_bytes(b"\x5a" * 100 + data[100:])
    else:  # a page in the middle: the header still reads, the file does not
        page = len(data) // 4096 // 2
        path.write_bytes(data[:page * 4096] + b"\xa5" * 4096 + data[(page + 1) * 4096:])


@pytest.mark.parametrize("how", ["truncated", "header", "middle"])
def test_a_damaged_outbox_is_moved_aside_and_edged_serves(
        service: InferenceService, broker: Broker, tmp_path: Path, how: str,
        caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "state"
    state.mkdir()
    stored_outbox(state / OUTBOX_FILE, 200)
    damage(state / OUTBOX_FILE, how)
    config = MqttConfig(broker=broker.url, device_id="damaged1", reconnect_min_s=0.05, reconnect_max_s=0.5)
    with caplog.at_level(logging.ERROR, logger="edged.mqtt"):
        front = MqttFrontEnd(service, config, state, version="test")  # refused to start: "malformed"
    aside = sorted(p.name for p in state.iterdir() if p.name.startswith(OUTBOX_FILE + ".damaged-"))
    assert aside and not any(name.endswith(("-wal", "-shm")) for name in aside[:1]), aside
    assert any(aside[0] in record.getMessage() and "damaged" in record.getMessage() for record in caplog.records)
    assert front.status()["outbox"]["depth"] == 0
    front.start()
    sub = Subscriber(broker.port, ["replies/damaged"])
    try:
        wait_until(lambda: front.status()["subscribed"], what="subscribed")
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = "replies/damaged"
        sub.client.publish("edged/damaged1/infer/tiny_mlp", frame(1), 1, properties=props)
        replies = sub.wait_for(1)
        assert replies and b'"outputs"' in replies[0].payload, replies
    finally:
        sub.close()
        front.stop(5)


def test_a_stored_result_whose_topic_brokers_refuse_is_dropped_at_start(
        service: InferenceService, broker: Broker, tmp_path: Path) -> None:
    """An outbox written before reply topics were checked for control characters can hold a result that mosquitto
    answers by closing the connection. Before, such a device stayed cut off after the upgrade: the stored row
    was sent again on every reconnect. It is now dropped when the outbox opens, counted bad_topic."""
    state = tmp_path / "state"
    state.mkdir()
    outbox = Outbox(state / OUTBOX_FILE, OutboxConfig(), Metrics())
    outbox.start(lambda message: None)
    outbox.put(Outbound("replies/a\x01b", b"{}", 1, message_id="poisoned"))
    outbox.put(Outbound("replies/fine", b"{}", 1, message_id="fine"))
    wait_until(lambda: outbox.depth == 2, what="the results stored")
    outbox.stop(5)
    config = MqttConfig(broker=broker.url, device_id="poisoned1", reconnect_min_s=0.05, reconnect_max_s=0.5)
    front = MqttFrontEnd(service, config, state, version="test")
    sub = Subscriber(broker.port, ["replies/#"])
    front.start()
    try:
        wait_until(lambda: front.status()["subscribed"], what="subscribed")
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = "replies/after"
        sub.client.publish("edged/poisoned1/infer/tiny_mlp", frame(1), 1, properties=props)
        wait_until(lambda: any(m.topic == "replies/after" for m in sub.messages), what="the reply")
        status = front.status()
        assert [m.topic for m in sub.messages] == ["replies/fine", "replies/after"]
        assert (status["connects"], status["drops"].get("bad_topic"), status["outbox"]["depth"]) == (1, 1, 0)
    finally:
        sub.close()
        front.stop(5)

"""What one message costs the outbox, counted so that it cannot creep back: SQL statements and wake-ups of the
outbox thread per message through a real pipeline over a real mosquitto (issue #12 §4).

Before: an INSERT and a DELETE per message plus BEGIN/COMMIT per pass, and a wake-up per put and per PUBACK.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import paho.mqtt.client as paho
from conftest import Broker, Subscriber, wait_until
from paho.mqtt.enums import CallbackAPIVersion
from test_mqtt_outbox import frame, ids_of

from edged.config import MqttConfig, PipelineConfig
from edged.engine import InferenceService
from edged.mqtt import MqttFrontEnd

MESSAGES = 2000
WINDOW = 128  # inputs in flight, as `edged bench --transport mqtt` keeps them


def statement_kind(sql: str) -> str:
    """The statement's verb, with the message id state's insert told apart from the outbox's."""
    return "ANSWERED" if "inbound_answered" in sql else sql.split(None, 1)[0].upper()


def test_a_qos1_stream_costs_the_outbox_few_statements_and_wake_ups_per_message(
        service: InferenceService, broker: Broker, tmp_path: Path) -> None:
    config = MqttConfig(broker=broker.url, device_id="cost1",
                        pipelines=(PipelineConfig(input="cost/+/in", model="tiny_mlp", output="cost/{1}/out",
                                                  qos=1, max_in_flight=256),))
    front = MqttFrontEnd(service, config, tmp_path / "state", version="test")
    front.start()
    sub = Subscriber(broker.port, ["cost/+/out"])
    pub = paho.Client(CallbackAPIVersion.VERSION2, client_id="cost-sensor")
    window = threading.Semaphore(WINDOW)
    pub.on_publish = lambda *args: window.release()
    pub.connect("127.0.0.1", broker.port)
    pub.loop_start()
    statements: Counter[str] = Counter()
    outbox = front._outbox
    try:
        wait_until(lambda: front.status()["connected"], what="connected")
        outbox.trace(lambda sql: statements.update([statement_kind(sql)]))
        wakeups_before = outbox.wakeups
        for i in range(MESSAGES):
            assert window.acquire(timeout=30)
            pub.publish(f"cost/s{i % 4}/in", frame(i), 1)
        wait_until(lambda: len(ids_of(list(sub.messages))[0]) >= MESSAGES, 60, f"{MESSAGES} results")
        assert outbox.wait_drained(30)
        outbox.trace(None)
        wakeups = outbox.wakeups - wakeups_before
    finally:
        pub.loop_stop()
        sub.close()
        front.stop(5)
    per_message = sum(statements.values()) / MESSAGES
    print(f"per message: {per_message:.3f} statements {dict(statements)}, {wakeups / MESSAGES:.3f} wake-ups")
    assert statements["INSERT"] == MESSAGES
    # the inputs the results answer (stable message ids): one statement per group commit, like the DELETE
    assert statements["ANSWERED"] <= MESSAGES * 0.1, statements
    assert statements["DELETE"] <= MESSAGES * 0.1, statements  # one per group of acknowledgements
    assert per_message <= 1.3, statements
    assert wakeups <= MESSAGES * 0.5, wakeups

"""What one message costs the daemon, counted so that it cannot creep back: SQL statements, wake-ups of the
outbox thread, hand-offs between threads, reads of the broker's socket and wake-ups of the network thread per
message through a real pipeline over a real mosquitto (issue #12 §4).

Before: an INSERT and a DELETE per message plus BEGIN/COMMIT per pass, and a wake-up per put and per PUBACK;
three socket reads per packet (two packets per message); a notify of the pipeline worker per message, an engine
worker's hop and back per batch; a wake-up byte to the network thread per PUBLISH and per PUBACK it writes.
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
        connection, pipeline = front._connection, front._pipelines[0]
        engine = service.version_info("tiny_mlp").scheduler
        assert engine is not None
        counters = lambda: (connection.reads, connection.wakes, pipeline.handoffs, engine.wakeups,  # noqa: E731
                            connection.slow_decodes)
        before = counters()
        for i in range(MESSAGES):
            assert window.acquire(timeout=30)
            pub.publish(f"cost/s{i % 4}/in", frame(i), 1)
        wait_until(lambda: len(ids_of(list(sub.messages))[0]) >= MESSAGES, 60, f"{MESSAGES} results")
        assert outbox.wait_drained(30)
        outbox.trace(None)
        wakeups = outbox.wakeups - wakeups_before
        reads, wakes, handoffs, engine_wakeups, slow = (b - a for a, b in zip(before, counters(), strict=True))
    finally:
        pub.loop_stop()
        sub.close()
        front.stop(5)
    per_message = sum(statements.values()) / MESSAGES
    print(f"per message: {per_message:.3f} statements {dict(statements)}, {wakeups / MESSAGES:.3f} outbox wake-ups, "
          f"{handoffs / MESSAGES:.3f} pipeline and {engine_wakeups / MESSAGES:.3f} engine worker hand-offs, "
          f"{reads / MESSAGES:.3f} socket reads, "
          f"{wakes / MESSAGES:.3f} network thread wake-ups, {slow} slow decodes")
    assert statements["INSERT"] == MESSAGES
    # the inputs the results answer (stable message ids): one statement per group commit, like the DELETE
    assert statements["ANSWERED"] <= MESSAGES * 0.1, statements
    assert statements["DELETE"] <= MESSAGES * 0.1, statements  # one per group of acknowledgements
    assert per_message <= 1.3, statements
    assert wakeups <= MESSAGES * 0.5, wakeups
    # the inputs and the PUBACKs for the results arrive in bursts: before, three reads per packet
    assert reads <= MESSAGES * 1.0, reads
    assert wakes <= MESSAGES * 1.0, wakes  # before: one per PUBLISH and one per PUBACK written, 2 per message
    assert handoffs <= MESSAGES * 0.5, handoffs  # before: a notify of the pipeline worker per input
    # before: a hop to an engine worker per batch (its results then woke the pipeline worker); now the pipeline
    # worker runs its batches itself, and hands over only what exceeds its inline share (engine/scheduler.py)
    assert engine_wakeups <= MESSAGES * 0.01, engine_wakeups
    assert slow == 0  # mosquitto's PUBLISH and PUBACK packets need none of paho's Properties

"""Supervised MQTT threads: a raw SQLite error, a failing publish or callback restarts the outbox thread, which
is counted and shown (retained status "degraded", then "online"); the outbox's pending list stays bounded."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from conftest import Broker, Subscriber, wait_until
from prometheus_client.parser import text_string_to_metric_families
from sqlite_faults import flaky_sqlite
from test_mqtt_outbox import frame

from edged.config import MqttConfig, OutboxConfig, PipelineConfig
from edged.daemon._health import health_status, render_health
from edged.engine import InferenceService
from edged.mqtt import MqttFrontEnd
from edged.mqtt._message import Outbound
from edged.mqtt._metrics import Metrics
from edged.mqtt._outbox import Outbox
from edged.mqtt._paho import Connection
from edged.mqtt._settings import connection_settings
from edged.supervision import HealthBoard

WAIT_S = 20.0


def statuses(sub: Subscriber) -> list[dict[str, Any]]:
    return [orjson.loads(m.payload) for m in list(sub.messages)]


def counters(board: HealthBoard) -> dict[tuple[str, str], float]:
    return {(s.name, s.labels.get("thread") or s.labels.get("component", "")): s.value
            for f in text_string_to_metric_families(render_health(board)) for s in f.samples}


def test_a_raw_sqlite_error_restarts_the_outbox_thread_and_the_status_says_so(
        service: InferenceService, broker: Broker, tmp_path: Path) -> None:
    state = tmp_path / "state"
    stored = Outbox(state / "mqtt-outbox.sqlite3", OutboxConfig(), Metrics())  # results of an earlier run
    stored.start(lambda message: None)
    for i in range(5):
        stored.put(Outbound("results/backlog", f"old-{i}".encode(), 1, message_id=f"old-{i}"))
    stored.stop(5)
    status_sub = Subscriber(broker.port, ["edged/sup1/status"])
    results = Subscriber(broker.port, ["results/#"])
    board = HealthBoard()
    config = MqttConfig(broker=broker.url, device_id="sup1", pipelines=(
        PipelineConfig(input="sensors/+/frame", model="tiny_mlp", output="results/{1}"),))
    with flaky_sqlite(fail_on="WHERE seq >") as made:  # the outbox's first load of stored rows fails
        fe = MqttFrontEnd(service, config, state, version="t", health=board)
    try:
        fe.start()
        assert made and made[0].failed.wait(WAIT_S)
        wait_until(lambda: any(d["state"] == "degraded" for d in statuses(status_sub)), WAIT_S, "degraded")
        degraded = next(d for d in statuses(status_sub) if d["state"] == "degraded")
        assert "mqtt_outbox" in degraded["reason"] and "OperationalError: disk I/O error" in degraded["reason"]
        wait_until(lambda: statuses(status_sub)[-1]["state"] == "online", WAIT_S, "online again")
        wait_until(lambda: len(results.messages) == 5, WAIT_S, "the stored backlog delivered")
        for i in range(10):
            results.client.publish("sensors/s1/frame", frame(i), 1)
        wait_until(lambda: len(results.messages) == 15, WAIT_S, "new results delivered")
        assert sorted(m.payload for m in results.messages[:5]) == [f"old-{i}".encode() for i in range(5)]
        health = health_status(board)
        assert health["state"] == "ok"
        outbox = health["components"]["mqtt_outbox"]
        assert (outbox["state"], outbox["restarts"], outbox["errors"]) == ("ok", 1, 1)
        assert "disk I/O error" in outbox["last_error"]
        numbers = counters(board)
        assert numbers[("edged_thread_restarts_total", "mqtt_outbox")] == 1
        assert numbers[("edged_thread_errors_total", "mqtt_outbox")] == 1
        assert numbers[("edged_component_degraded", "mqtt_outbox")] == 0
        assert service.ready  # inference is unaffected
    finally:
        fe.stop(5)
        status_sub.close()
        results.close()


def acking_publisher(outbox: list[Outbox], sent: list[Outbound], fail_at: int) -> Callable[[Outbound], int]:
    """Publish as the broker would (each message acknowledged at once); call number ``fail_at`` raises."""
    calls = iter(range(1, 10_000))

    def publish(message: Outbound) -> int:
        mid = next(calls)
        if mid == fail_at:
            raise RuntimeError("paho: out of memory")
        sent.append(message)
        threading.Thread(target=outbox[0].on_acked, args=(mid, True)).start()
        return mid

    return publish


def test_a_publish_that_raises_restarts_the_thread_and_nothing_is_lost_or_reordered(tmp_path: Path) -> None:
    board, sent, holder = HealthBoard(), [], []
    outbox = Outbox(tmp_path / "o.sqlite3", OutboxConfig(), Metrics(), health=board)
    holder.append(outbox)
    outbox.start(acking_publisher(holder, sent, fail_at=3))
    outbox.set_connected(True)
    for i in range(10):
        outbox.put(Outbound("t/x", f"{i}".encode(), 1, message_id=f"id-{i}"))
    try:
        assert outbox.wait_drained(WAIT_S)
        assert [m.payload for m in sent] == [f"{i}".encode() for i in range(10)]
        health = board.component("mqtt_outbox").health
        assert (health.state, health.restarts, health.errors) == ("ok", 1, 1)
        assert health.last_error == "RuntimeError: paho: out of memory"
    finally:
        outbox.stop(5)


def test_a_stored_callback_that_raises_still_lets_every_other_input_be_acknowledged(tmp_path: Path) -> None:
    board = HealthBoard()
    outbox = Outbox(tmp_path / "o.sqlite3", OutboxConfig(), Metrics(), health=board)
    acked: list[int] = []
    done = threading.Event()

    def on_stored(i: int) -> None:
        if i == 0:
            raise ValueError("ack of a message from a dead connection")
        acked.append(i)
        if len(acked) == 4:
            done.set()

    outbox.start(lambda message: None)
    try:
        with outbox._cond:  # one group commit for all five, so the failure is inside a batch
            for i in range(5):
                outbox._pending.append((Outbound("t/x", b"p", 1, on_stored=lambda i=i: on_stored(i)), 0.0, 0.0))
            outbox._wake()  # the thread waits on its own condition
        assert done.wait(WAIT_S)
        wait_until(lambda: board.component("mqtt_outbox").health.errors == 1, WAIT_S, "the error counted")
        assert sorted(acked) == [1, 2, 3, 4] and outbox.depth == 5  # all five stored once, none twice
    finally:
        outbox.stop(5)


def test_pending_bound_holds_under_a_flood_with_the_broker_down_and_the_disk_stalled(tmp_path: Path) -> None:
    metrics = Metrics()
    with flaky_sqlite(stall_on="INSERT INTO outbox (") as made:  # not the id salt's insert at open
        outbox = Outbox(tmp_path / "o.sqlite3", OutboxConfig(), metrics, pending_max=8, pending_wait_s=0.05)
    outbox.start(lambda message: None)  # never connected: the broker is down
    stored: list[int] = []
    try:
        outbox.put(Outbound("t/x", b"first", 1, on_stored=lambda: stored.append(-1)))
        assert made[0].stalled.wait(WAIT_S)  # the outbox thread is stuck writing the first message
        results: list[bool] = []
        lock = threading.Lock()

        def flood(worker: int) -> None:
            for _ in range(25):
                ok = outbox.put(Outbound("t/x", b"x", 1, on_stored=lambda: stored.append(worker)))
                with lock:
                    results.append(ok)

        threads = [threading.Thread(target=flood, args=(w,)) for w in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S)
        assert results.count(True) == 8 and results.count(False) == 92
        assert metrics.snapshot()["drops"]["outbox_busy"] == 92
        assert outbox.depth == 9 and stored == []  # nothing refused was acknowledged
        made[0].go_on.set()
        wait_until(lambda: len(stored) == 9, WAIT_S, "the accepted messages stored")
        assert outbox.depth == 9
    finally:
        made[0].go_on.set()
        outbox.stop(5)


class ListenerFailingOnce:
    """The front end's side of the connection, failing the first time it hears of a connection."""

    def __init__(self) -> None:
        self.connects = 0
        self.reconnected = threading.Event()
        self.down: list[str] = []

    def on_connected(self, session_present: bool) -> None:
        self.connects += 1
        if self.connects == 1:
            raise RuntimeError("a bug in on_connected")
        self.reconnected.set()

    def on_disconnected(self, reason: str) -> None:
        self.down.append(reason)

    def on_message(self, message: Any) -> None:
        return None

    def on_acked(self, mid: int, ok: bool) -> None:
        return None


def test_the_network_thread_restarts_after_an_exception_and_reconnects(broker: Broker) -> None:
    board, listener = HealthBoard(), ListenerFailingOnce()
    settings = connection_settings(MqttConfig(broker=broker.url, device_id="sup2", reconnect_min_s=0.05,
                                              reconnect_max_s=0.1))
    will = Outbound("edged/sup2/status", b'{"state": "offline"}', 1, retain=True)
    connection = Connection(settings, listener, will, [], board)
    connection.start()
    try:
        assert listener.reconnected.wait(WAIT_S)
        wait_until(lambda: connection.connected and board.component("mqtt_network").health.state == "ok", WAIT_S,
                   "healthy again")
        health = board.component("mqtt_network").health
        assert (health.restarts, health.errors) == (1, 1) and "a bug in on_connected" in health.last_error
        assert listener.down == ["the network thread failed; reconnecting"] and connection.connects == 2
    finally:
        connection.stop(5)


def test_a_handled_write_failure_shows_degraded_until_a_write_succeeds_and_keeps_the_message(
        tmp_path: Path) -> None:
    board, metrics = HealthBoard(), Metrics()
    # a result's insert, not the id salt's (INSERT OR IGNORE INTO outbox_meta), which runs when the file opens
    with flaky_sqlite(fail_on="INSERT INTO outbox (") as made:
        outbox = Outbox(tmp_path / "o.sqlite3", OutboxConfig(), metrics, health=board)
    component = board.component("mqtt_outbox")
    seen: list[tuple[str, str]] = []  # every change, so the short degraded spell of one retry cannot be missed
    board.add_listener(lambda: seen.append((component.health.state, component.health.reason)))
    outbox.start(lambda message: None)
    try:
        outbox.put(Outbound("t/x", b"retried", 1))
        assert made[0].failed.wait(WAIT_S)
        wait_until(lambda: any(state == "degraded" for state, _ in seen), WAIT_S, "degraded")
        assert "write failed" in next(reason for state, reason in seen if state == "degraded")
        assert component.health.restarts == 0
        assert metrics.snapshot()["errors"]["outbox_write"] == 1
        outbox.put(Outbound("t/x", b"kept", 1))
        wait_until(lambda: component.health.state == "ok", WAIT_S, "healthy after a good write")
        # the failed write's message was kept in memory and retried (the outbox branch): both are stored
        wait_until(lambda: outbox.depth == 2 and outbox.flush(WAIT_S), WAIT_S, "both stored")
        assert [state for state, _ in seen] == ["degraded", "ok"]
    finally:
        outbox.stop(5)

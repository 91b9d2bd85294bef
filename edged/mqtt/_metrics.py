"""Counters of the MQTT front end and their Prometheus text rendering.

Every message edged drops is counted here by reason; nothing is lost silently.
"""

from __future__ import annotations

import threading
from collections import Counter

from edged.exposition import MetricFamily, render

DROP_REASONS = ("outbox_full", "outbox_expired", "outbox_busy", "backpressure", "bad_topic", "no_reply_topic",
                "not_connected", "retained", "unrouted", "shutdown")


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._drops: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[name] += amount

    def drop(self, reason: str, amount: int = 1) -> None:
        with self._lock:
            self._drops[reason] += amount

    def error(self, kind: str, amount: int = 1) -> None:
        with self._lock:
            self._errors[kind] += amount

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {"counts": dict(self._counts), "drops": dict(self._drops), "errors": dict(self._errors)}


def render_prometheus(snapshot: dict[str, dict[str, int]], connected: bool, outbox_depth: int,
                      outbox_bytes: int, in_flight: int, disk: tuple[bool, int] = (False, -1)) -> str:
    """``disk``: (whether outbox writes fail, free bytes in the state directory or -1 when unknown)."""
    counts, drops, errors = snapshot["counts"], snapshot["drops"], snapshot["errors"]
    dropped = MetricFamily("edged_mqtt_dropped_total", "counter", "Messages dropped, by reason.")
    for reason in sorted(set(DROP_REASONS) | set(drops)):
        dropped.add(drops.get(reason, 0), {"reason": reason})
    failed = MetricFamily("edged_mqtt_errors_total", "counter", "Errors, by kind.")
    for kind, value in sorted(errors.items()):
        failed.add(value, {"kind": kind})
    return render([
        MetricFamily("edged_mqtt_connected", "gauge", "Whether the MQTT connection to the broker is up.")
        .add(int(connected)),
        MetricFamily("edged_mqtt_messages_received_total", "counter", "MQTT messages received.")
        .add(counts.get("received", 0)),
        MetricFamily("edged_mqtt_messages_published_total", "counter",
                     "MQTT messages acknowledged by the broker (QoS 0: sent).").add(counts.get("published", 0)),
        MetricFamily("edged_mqtt_outbox_messages", "gauge", "Messages in the durable outbox, not yet acknowledged.")
        .add(outbox_depth),
        MetricFamily("edged_mqtt_outbox_bytes", "gauge", "Payload bytes in the durable outbox.").add(outbox_bytes),
        MetricFamily("edged_mqtt_outbox_in_flight", "gauge", "Outbox messages sent and awaiting PUBACK.")
        .add(in_flight),
        MetricFamily("edged_mqtt_outbox_write_failing", "gauge",
                     "1 while outbox writes fail (a full disk): messages wait in memory.").add(int(disk[0])),
        MetricFamily("edged_mqtt_state_dir_free_bytes", "gauge",
                     "Free bytes on the file system of the state directory.").add(disk[1]),
        MetricFamily("edged_mqtt_connects_total", "counter",
                     "Successful connections to the broker, the first one included.").add(counts.get("connects", 0)),
        MetricFamily("edged_mqtt_inputs_replayed_total", "counter",
                     "Inputs the broker sent again as new (no DUP flag) after edged had answered them on an earlier "
                     "connection: a broker that lost its state; their results repeat under new ids.")
        .add(counts.get("replayed", 0)),
        MetricFamily("edged_mqtt_chat_requests_total", "counter",
                     "Chat requests taken from the chat topic.").add(counts.get("chat_requests", 0)),
        dropped, failed,
    ])

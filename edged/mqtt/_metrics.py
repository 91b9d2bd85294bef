"""Counters of the MQTT front end and their Prometheus text rendering.

Every message edged drops is counted here by reason; nothing is lost silently.
"""

from __future__ import annotations

import threading
from collections import Counter

DROP_REASONS = ("outbox_full", "outbox_expired", "backpressure", "bad_topic", "no_reply_topic", "not_connected",
                "retained", "unrouted", "shutdown")


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
    lines = [
        "# HELP edged_mqtt_connected Whether the MQTT connection to the broker is up.",
        "# TYPE edged_mqtt_connected gauge",
        f"edged_mqtt_connected {int(connected)}",
        "# HELP edged_mqtt_messages_received_total MQTT messages received.",
        "# TYPE edged_mqtt_messages_received_total counter",
        f"edged_mqtt_messages_received_total {counts.get('received', 0)}",
        "# HELP edged_mqtt_messages_published_total MQTT messages acknowledged by the broker (QoS 0: sent).",
        "# TYPE edged_mqtt_messages_published_total counter",
        f"edged_mqtt_messages_published_total {counts.get('published', 0)}",
        "# HELP edged_mqtt_outbox_messages Messages in the durable outbox, not yet acknowledged.",
        "# TYPE edged_mqtt_outbox_messages gauge",
        f"edged_mqtt_outbox_messages {outbox_depth}",
        "# HELP edged_mqtt_outbox_bytes Payload bytes in the durable outbox.",
        "# TYPE edged_mqtt_outbox_bytes gauge",
        f"edged_mqtt_outbox_bytes {outbox_bytes}",
        "# HELP edged_mqtt_outbox_in_flight Outbox messages sent and awaiting PUBACK.",
        "# TYPE edged_mqtt_outbox_in_flight gauge",
        f"edged_mqtt_outbox_in_flight {in_flight}",
        "# HELP edged_mqtt_outbox_write_failing 1 while outbox writes fail (a full disk): messages wait in memory.",
        "# TYPE edged_mqtt_outbox_write_failing gauge",
        f"edged_mqtt_outbox_write_failing {int(disk[0])}",
        "# HELP edged_mqtt_state_dir_free_bytes Free bytes on the file system of the state directory.",
        "# TYPE edged_mqtt_state_dir_free_bytes gauge",
        f"edged_mqtt_state_dir_free_bytes {disk[1]}",
        "# HELP edged_mqtt_connects_total Successful connections to the broker, the first one included.",
        "# TYPE edged_mqtt_connects_total counter",
        f"edged_mqtt_connects_total {counts.get('connects', 0)}",
        "# HELP edged_mqtt_dropped_total Messages dropped, by reason.",
        "# TYPE edged_mqtt_dropped_total counter",
    ]
    lines += [f'edged_mqtt_dropped_total{{reason="{r}"}} {drops.get(r, 0)}' for r in
              sorted(set(DROP_REASONS) | set(drops))]
    lines += ["# HELP edged_mqtt_errors_total Errors, by kind.", "# TYPE edged_mqtt_errors_total counter"]
    lines += [f'edged_mqtt_errors_total{{kind="{k}"}} {v}' for k, v in sorted(errors.items())]
    return "\n".join(lines) + "\n"

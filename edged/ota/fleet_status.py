"""What the fleet reports: every device's retained ``edged/{device_id}/ota/status``, read from the broker.

Retained messages arrive right after the subscription; reading stops once none has come for ``quiet_s``
(or at ``timeout_s``). A wave's failures are the devices whose last status for the target is refused or
rolled_back: `edged fleet promote --broker` refuses to widen a wave past ``--max-failures`` of them.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from edged.errors import MqttError
from edged.mqtt import parse_broker

FAILED_STATES = frozenset({"refused", "rolled_back"})


def read_fleet(broker: str, *, quiet_s: float = 1.0, timeout_s: float = 15.0) -> dict[str, dict[str, Any]]:
    host, port, tls = parse_broker(broker)
    found: dict[str, dict[str, Any]] = {}
    last = [time.monotonic()]
    subscribed = threading.Event()
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id="")
    if tls:
        client.tls_set()

    def on_connect(c: paho.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        if not reason.is_failure:
            c.subscribe("edged/+/ota/status", qos=1)
            subscribed.set()

    def on_message(_c: paho.Client, _u: Any, message: paho.MQTTMessage) -> None:
        device = message.topic.split("/")[1]
        try:
            found[device] = dict(json.loads(message.payload))
        except (ValueError, TypeError):
            found[device] = {"state": "unreadable", "reason": f"status payload is not JSON: {message.payload[:80]!r}"}
        last[0] = time.monotonic()

    client.on_connect = on_connect
    client.on_message = on_message
    try:
        client.connect(host, port)
    except OSError as e:
        raise MqttError(f"broker {broker}: cannot connect: {e}; check that the broker runs there and that "
                        "--broker names its host and port") from e
    client.loop_start()
    try:
        began = time.monotonic()
        if not subscribed.wait(timeout_s):
            raise MqttError(f"broker {broker}: no connection within {timeout_s:g} s")
        last[0] = max(last[0], time.monotonic())
        while time.monotonic() - last[0] < quiet_s and time.monotonic() - began < timeout_s:
            time.sleep(0.05)
    finally:
        client.loop_stop()
        client.disconnect()
    return found


def failures(fleet: dict[str, dict[str, Any]], target: str) -> list[str]:
    return sorted(device for device, doc in fleet.items()
                  if doc.get("target") == target and doc.get("state") in FAILED_STATES)


def table(fleet: dict[str, dict[str, Any]]) -> str:
    rows = [("DEVICE", "TARGET", "STATE", "REASON")]
    rows += [(device, str(doc.get("target") or "-"), str(doc.get("state")), str(doc.get("reason") or ""))
             for device, doc in sorted(fleet.items())]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}" for r in rows)

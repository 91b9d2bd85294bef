"""Load-generating MQTT clients for benchmarks and tests, over the same paho adapter as the front end.

``RequestClient`` sends MQTT v5 requests to ``edged/{device_id}/infer/{model}`` with a ResponseTopic private to
the client and a fresh CorrelationData each; ``request()`` blocks until the matching reply, so N threads keep N
requests outstanding. ``PipelineClient`` publishes sensor messages and counts what comes back on an output
filter, once per edged message id (a QoS 1 redelivery is a duplicate, not a second result).

Both wait, on ``start()``, until the broker has processed their subscriptions: they publish a probe to a topic
of their own and wait for it to come back, which the broker can only do after the SUBSCRIBE sent before it.
"""

from __future__ import annotations

import abc
import itertools
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

import orjson

from edged.errors import MqttError, RequestTimeout
from edged.mqtt._codecs import JSON_TYPE
from edged.mqtt._message import Inbound, Outbound
from edged.mqtt._paho import Connection
from edged.mqtt._settings import ConnectionSettings, parse_broker

MESSAGE_ID = "edged-message-id"
_ERROR_PREFIX = b'{"error":'  # error_payload() always writes "error" as the first key
C = TypeVar("C", bound="_Client")


def is_error_payload(payload: bytes) -> bool:
    """Whether a reply or pipeline result is edged's ``{"error": ...}`` document."""
    return payload.startswith(_ERROR_PREFIX)


class _ReplyingConnection(Connection):
    """Sets the v5 ResponseTopic on every request (an Outbound has no field for it: edged itself never asks
    for replies)."""

    reply_topic = ""

    def _properties(self, message: Outbound) -> Any:
        props = super()._properties(message)
        if props is not None and self.reply_topic and message.correlation_data is not None:
            props.ResponseTopic = self.reply_topic
        return props


class _Client(abc.ABC):
    """One connection, a probe topic proving the subscriptions are active, and a listener for the rest."""

    def __init__(self, broker_url: str, subscriptions: list[tuple[str, int]], reply_topic: str = "") -> None:
        host, port, tls = parse_broker(broker_url)
        self.client_id = f"edged-loadgen-{secrets.token_hex(6)}"
        self._probe_topic = f"edged-loadgen/{self.client_id}/probe"
        settings = ConnectionSettings(host=host, port=port, tls=tls, protocol="5", client_id=self.client_id,
                                      keepalive_s=30, session_expiry_s=0, reconnect_min_s=0.1,
                                      reconnect_max_s=2.0)
        will = Outbound(f"edged-loadgen/{self.client_id}/gone", b"", 0)
        connection = _ReplyingConnection(settings, self, will, [(self._probe_topic, 1), *subscriptions])
        connection.reply_topic = reply_topic
        self._connection = connection
        self._connected = threading.Event()
        self._probed = threading.Event()

    def start(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        self._connection.start()
        while not self._probed.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                self.stop()
                where = self._connection.last_error or "no CONNACK and no probe came back"
                raise MqttError(f"load generator: broker not usable within {timeout_s:.0f} s ({where})")
            if self._connected.wait(min(left, 0.5)):
                self._connection.publish(Outbound(self._probe_topic, b"probe", 1))
                self._probed.wait(min(left, 0.5))

    def stop(self) -> None:
        self._connection.stop(2.0)

    def __enter__(self: C) -> C:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    def publish(self, message: Outbound) -> bool:
        """Hand a message to paho; False when it was not taken."""
        return self._connection.publish(message) is not None

    # --- Listener (network thread) -------------------------------------------------------------------------
    def on_connected(self, session_present: bool) -> None:
        self._connected.set()

    def on_disconnected(self, reason: str) -> None:
        self._connected.clear()

    def on_acked(self, mid: int, ok: bool) -> None:
        """Losses are counted end to end, not per acknowledgement."""
        return

    def on_message(self, message: Inbound) -> None:
        if message.topic == self._probe_topic:
            self._probed.set()
        else:
            self.received(message)
        self._connection.ack(message)

    @abc.abstractmethod
    def received(self, message: Inbound) -> None:
        """A message on one of the subscribed topics other than the readiness probe."""


@dataclass
class _Slot:
    done: threading.Event = field(default_factory=threading.Event)
    payload: bytes = b""


class RequestClient(_Client):
    """Blocking request/response against one device; thread-safe, one outstanding request per thread."""

    def __init__(self, broker_url: str, device_id: str, qos: int = 1) -> None:
        token = secrets.token_hex(6)
        reply = f"edged-loadgen/{token}/reply"
        self._status_topic = f"edged/{device_id}/status"
        super().__init__(broker_url, [(reply, qos), (self._status_topic, 1)], reply)
        self.device_id = device_id
        self.qos = qos
        self.late_replies = 0  # replies that came after their request timed out, or were never asked for
        self._reply = reply
        self._lock = threading.Lock()
        self._pending: dict[bytes, _Slot] = {}
        self._ids: Iterator[int] = itertools.count(1)
        self._online = threading.Event()

    def wait_online(self, timeout_s: float) -> None:
        """Until the device's retained status says "online" (its birth message)."""
        if not self._online.wait(timeout_s):
            raise MqttError(f"device {self.device_id!r}: no \"online\" status on {self._status_topic} within "
                            f"{timeout_s:.0f} s")

    def request(self, model: str, payload: bytes, timeout_s: float, version: str = "",
                content_type: str = JSON_TYPE) -> bytes:
        """The reply's payload (an error reply too: see ``is_error_payload``)."""
        topic = f"edged/{self.device_id}/infer/{model}" + (f"/{version}" if version else "")
        slot = _Slot()
        with self._lock:
            correlation = next(self._ids).to_bytes(8, "big")
            self._pending[correlation] = slot
        if not self.publish(Outbound(topic, payload, self.qos, correlation_data=correlation,
                                     content_type=content_type)):
            self._forget(correlation)
            raise MqttError(f"load generator: paho did not take the request to {topic}")
        if not slot.done.wait(timeout_s):
            self._forget(correlation)
            raise RequestTimeout(f"no reply to a request to {topic} within {timeout_s:g} s")
        return slot.payload

    def _forget(self, correlation: bytes) -> None:
        with self._lock:
            self._pending.pop(correlation, None)

    def received(self, message: Inbound) -> None:
        if message.topic == self._status_topic:
            self._status(message.payload)
            return
        with self._lock:
            slot = self._pending.pop(message.correlation_data or b"", None)
            if slot is None:
                self.late_replies += 1
                return
        slot.payload = message.payload
        slot.done.set()

    def _status(self, payload: bytes) -> None:
        try:
            state = orjson.loads(payload).get("state")
        except (orjson.JSONDecodeError, AttributeError):
            state = None
        if state == "online":
            self._online.set()
        else:
            self._online.clear()


class PipelineClient(_Client):
    """Publishes inputs and counts unique results on ``output_filter`` (if given), with arrival times per topic."""

    def __init__(self, broker_url: str, output_filter: str | None = None, qos: int = 1) -> None:
        super().__init__(broker_url, [(output_filter, qos)] if output_filter else [])
        self.qos = qos
        self.duplicates = 0
        self.errors = 0  # results that are {"error": ...} documents
        self._cond = threading.Condition()
        self._seen: set[str] = set()
        self._arrivals: dict[str, list[float]] = {}
        self._count = 0
        self._wanted = 0  # wake a waiter only when its count is reached, not on every message

    @property
    def count(self) -> int:
        return self._count

    def send(self, topic: str, payload: bytes, content_type: str = JSON_TYPE) -> bool:
        return self.publish(Outbound(topic, payload, self.qos, content_type=content_type))

    def wait_count(self, count: int, timeout_s: float) -> int:
        """Unique results received once ``count`` arrived or ``timeout_s`` passed."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._wanted = count
            while self._count < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self._count

    def arrivals(self, topic: str) -> list[float]:
        """``time.perf_counter()`` of each unique result on ``topic``, in arrival order."""
        with self._cond:
            return list(self._arrivals.get(topic, ()))

    def received(self, message: Inbound) -> None:
        now = time.perf_counter()
        key = message.user_property(MESSAGE_ID)
        with self._cond:
            if key is not None and key in self._seen:
                self.duplicates += 1
                return
            if key is not None:
                self._seen.add(key)
            self._arrivals.setdefault(message.topic, []).append(now)
            self.errors += is_error_payload(message.payload)
            self._count += 1
            if self._count >= self._wanted:
                self._cond.notify_all()

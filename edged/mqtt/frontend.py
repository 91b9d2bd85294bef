"""The MQTT front end: one broker connection, request/response topics, sensor pipelines, the durable outbox.

Built by the daemon only when ``[mqtt] broker`` is set. ``start()`` never blocks and never fails because the
broker is down: the connection retries with backoff and jitter while results accumulate in the outbox.
Status messages (birth, will, stopped) bypass the outbox on purpose: they describe the current connection,
and a stale "online" replayed after a restart would be wrong; a birth is published on every (re)connect.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson

from edged.clock import Clock, DeviceClock, state_file_in
from edged.config import MqttConfig
from edged.engine import InferenceService
from edged.errors import PayloadError
from edged.mqtt._chat import ChatCodec, ChatHandler
from edged.mqtt._codecs import JSON_TYPE, error_payload
from edged.mqtt._message import Inbound, Outbound
from edged.mqtt._metrics import Metrics, render_prometheus
from edged.mqtt._msgid import MessageIds
from edged.mqtt._outbox import Outbox
from edged.mqtt._paho import Connection
from edged.mqtt._pipeline import Pipeline, check_no_loops, check_outside_prefix
from edged.mqtt._requests import RequestHandler
from edged.mqtt._settings import connection_settings, device_id_of
from edged.mqtt._status import birth, offline, stopped
from edged.mqtt._subscriptions import SUBSCRIPTIONS_FILE, Subscriptions
from edged.mqtt._topics import parse_infer_topic
from edged.supervision import HealthBoard

log = logging.getLogger(__name__)
OUTBOX_FILE = "mqtt-outbox.sqlite3"
DISK_LOW_BYTES = 1 << 20


def _always() -> bool:
    return True


class MqttFrontEnd:
    def __init__(self, service: InferenceService, config: MqttConfig, state_dir: Path, *, version: str,
                 health: HealthBoard | None = None, clock: Clock | None = None,
                 commands: Mapping[str, Callable[[], None]] | None = None, chat: ChatCodec | None = None) -> None:
        """``clock``: the daemon's one DeviceClock for the state directory (default: a new one on it);
        ``chat``: OpenAI's chat shapes, which turn on ``{prefix}/chat`` (edged/mqtt/_chat.py)."""
        self._service = service
        # The daemon's clock of this state directory: the outbox ages its messages by its elapsed time.
        self.clock: Clock = clock or DeviceClock(state_file_in(state_dir))
        # other parts' command topics under the prefix ("ota/check" → a callback that must not block)
        self._commands = dict(commands or {})
        self._retained: dict[str, bytes] = {}  # other parts' retained state, republished on every connect
        self._config = config
        self._version = version
        self._settings = connection_settings(config)
        self.device_id = device_id_of(config)
        self.prefix = f"edged/{self.device_id}"
        self._metrics = Metrics()
        self.health = health or HealthBoard()
        self._state_dir = state_dir
        self._outbox = Outbox(state_dir / OUTBOX_FILE, config.outbox, self._metrics, clock=self.clock,
                              health=self.health)
        self._ids = MessageIds(self._settings.client_id, *self._outbox.id_state(self._settings.client_id),
                               on_replay=self._replayed)
        v5 = config.protocol == "5"
        identify = self._ids.identify
        # the pipelines first: each names its own bad input filter before anything else reads the filters
        self._pipelines = [Pipeline(i, service, p, config, v5, self, self._metrics, identify, self.health)
                           for i, p in enumerate(config.pipelines)]
        self._requests = RequestHandler(service, config, v5, self, self._metrics, identify, self.health,
                                        prefix=self.prefix)
        # after each pipeline's own checks, which name a bad filter first; edged's own topics before loops ("#")
        check_outside_prefix(config.pipelines, self.prefix)
        check_no_loops(config.pipelines)
        self._chat = None if chat is None else ChatHandler(service.generation, chat, config, self, self._metrics,
                                                          identify, self.health)
        subscriptions = [(f"{self.prefix}/infer/#", config.qos)]
        subscriptions += [(self._chat_topic, config.qos)] if self._chat is not None else []
        subscriptions += [(p.input, p.qos) for p in config.pipelines]
        subscriptions += [(f"{self.prefix}/{suffix}", 1) for suffix in self._commands]
        will = Outbound(self._status_topic, offline(self.device_id), 1, retain=True, content_type=JSON_TYPE)
        self._subscriptions = Subscriptions(state_dir / SUBSCRIPTIONS_FILE, self._settings.client_id,
                                            [topic_filter for topic_filter, _ in subscriptions])
        self._connection = Connection(self._settings, self, will, subscriptions, self.health,
                                      stale=self._subscriptions.stale, on_unsubscribed=self._subscriptions.save)
        self._stopping = False
        self.health.add_listener(self._health_changed)

    @property
    def _status_topic(self) -> str:
        return f"{self.prefix}/status"

    @property
    def _chat_topic(self) -> str:
        return f"{self.prefix}/chat"

    def _replayed(self, message: Inbound) -> None:
        """The broker sent an input edged had answered as if it were new (see _msgid): count it, log the first
        and then every power of two (a broker restored from an old snapshot replays a whole backlog)."""
        self._metrics.add("replayed")
        count = self._metrics.snapshot()["counts"]["replayed"]
        if count & (count - 1) == 0:
            log.warning("mqtt: the broker sent %d input(s) again without the DUP flag after edged had answered "
                        "them (latest on %s, packet id %d): it lost its state (a crash restored from an old "
                        "snapshot?); their results go out again under new edged_message_ids", count,
                        message.topic, message.mid)

    def new_message_id(self) -> str:
        """An id for a message that answers no input (telemetry); results take theirs from `MessageIds`."""
        return self._ids.fresh()

    # --- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> None:
        self._outbox.start(self._publish_stored)
        self._requests.start()
        if self._chat is not None:
            self._chat.start()
        for pipeline in self._pipelines:
            pipeline.start()
        self._connection.start()
        log.info("mqtt: connecting to %s:%d as %s", self._settings.host, self._settings.port,
                 self._settings.client_id)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Finish queued work, publish "stopped", deliver what the outbox holds (while connected), disconnect."""
        deadline = time.monotonic() + timeout_s
        self._stopping = True
        self._requests.stop(max(0.1, (deadline - time.monotonic()) / 2))
        if self._chat is not None:
            self._chat.stop(max(0.1, (deadline - time.monotonic()) / 2))
        for pipeline in self._pipelines:
            pipeline.stop(max(0.1, (deadline - time.monotonic()) / 2))
        if self._connection.connected:
            self._connection.publish(Outbound(self._status_topic, stopped(self.device_id), 1, retain=True,
                                              content_type=JSON_TYPE))
        self._outbox.wait_drained(max(0.0, deadline - time.monotonic()))
        self._connection.stop(max(0.1, deadline - time.monotonic()))
        self._outbox.stop(max(0.1, deadline - time.monotonic()))

    # --- what the daemon reports ---------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        snapshot = self._metrics.snapshot()
        return {
            "enabled": True, "connected": self._connection.connected, "subscribed": self._connection.subscribed,
            "broker": f"{self._settings.host}:{self._settings.port}", "tls": self._settings.tls,
            "protocol": self._settings.protocol, "client_id": self._settings.client_id,
            "device_id": self.device_id, "prefix": self.prefix, "connects": self._connection.connects,
            "last_error": self._connection.last_error,
            "messages_in": snapshot["counts"].get("received", 0),
            "messages_out": snapshot["counts"].get("published", 0),
            "inputs_replayed": snapshot["counts"].get("replayed", 0),
            "outbox": {"depth": self._outbox.depth, "bytes": self._outbox.stored_bytes,
                       "in_flight": self._outbox.in_flight, "fsync": self._config.outbox.fsync,
                       **self._disk()},
            "pipelines": [{"input": p.config.input, "model": p.config.model, "output": p.config.output,
                           "queued": p.queued} for p in self._pipelines],
            "drops": snapshot["drops"], "errors": snapshot["errors"],
        }

    def _disk(self) -> dict[str, Any]:
        """The outbox's disk: "full" (or "error") while writes fail, with why; free bytes of the state dir."""
        error = self._outbox.write_error
        try:
            free = shutil.disk_usage(self._state_dir).free
        except OSError:
            free = -1
        # SQLite says "database or disk is full", but a full disk can also surface as a "disk I/O error".
        full = "full" in error.lower() or 0 <= free < DISK_LOW_BYTES
        state = "ok" if not error else "full" if full else "error"
        return {"disk": state, "disk_error": error, "disk_free_bytes": free}

    def prometheus_lines(self) -> str:
        disk = self._disk()
        return render_prometheus(self._metrics.snapshot(), self._connection.connected, self._outbox.depth,
                                 self._outbox.stored_bytes, self._outbox.in_flight,
                                 (disk["disk"] != "ok", disk["disk_free_bytes"]))

    def publish_telemetry(self, payload: bytes) -> None:
        """Called on the daemon's event loop: never waits for room in the outbox (a full one drops, counted)."""
        self.send(Outbound(f"{self.prefix}/telemetry", payload, self._config.qos, content_type=JSON_TYPE,
                           message_id=self.new_message_id()), wait_s=0.0)

    def publish_state(self, suffix: str, payload: bytes) -> None:
        """Retained state of another part (``ota/status``): latest wins, so it bypasses the outbox like the
        birth message, and is published again after each reconnect."""
        self._retained[suffix] = payload
        if self._connection.connected:
            self._connection.publish(Outbound(f"{self.prefix}/{suffix}", payload, 1, retain=True,
                                              content_type=JSON_TYPE))

    # --- Publisher -----------------------------------------------------------------------------------------
    def send(self, message: Outbound, wait_s: float | None = None,
             room_wait: Callable[[], bool] | None = None) -> None:
        """``room_wait``: while it says so, a full outbox makes the caller wait for room (default: always; never
        on the network thread, which reads the PUBACKs that make room)."""
        if message.answers is not None:  # remember the input as answered before it is acknowledged
            message = dataclasses.replace(message, on_stored=self._ids.on_stored(message.answers, message.on_stored))
        if message.qos >= 1 and self._config.outbox.enabled:
            waits = None if self._connection.on_network_thread() else room_wait or _always
            self._outbox.put(message, wait_s, room_wait=waits)  # it calls on_stored after the group commit
            return
        if message.qos >= 1:
            self._connection.publish(message)  # paho queues it in memory while disconnected
        elif self._connection.connected and self._connection.publish(message) is not None:
            self._metrics.add("published")
        else:
            self._metrics.drop("not_connected")
        if message.on_stored is not None:
            message.on_stored()

    def _publish_stored(self, message: Outbound) -> int | None:
        """The outbox's way out. A message larger than the broker's Maximum Packet Size (v5 CONNACK) is sent as
        an error result in its place, under the same id: sent as it is, the broker would close the connection,
        and the outbox would send it again after every reconnect, for good."""
        limit = self._connection.max_packet_size
        if limit is not None:
            size = self._connection.packet_size(message)
            if size > limit:
                self._metrics.error("too_large")
                log.warning("mqtt: a message for %r is %d bytes, more than the broker's Maximum Packet Size of %d; "
                            "sending an error result in its place", message.topic[:200], size, limit)
                message = too_large(message, size, limit)
        return self._connection.publish(message)

    def ack(self, message: Inbound) -> None:
        self._connection.ack(message)

    # --- Listener (network thread) -------------------------------------------------------------------------
    def on_connected(self, session_present: bool) -> None:
        self._metrics.add("connects")
        log.info("mqtt: connected to %s:%d (session present: %s)", self._settings.host, self._settings.port,
                 session_present)
        self._publish_birth()
        for suffix, state in list(self._retained.items()):
            self._connection.publish(Outbound(f"{self.prefix}/{suffix}", state, 1, retain=True,
                                              content_type=JSON_TYPE))
        self._outbox.set_connected(True)

    def _publish_birth(self) -> None:
        state, reason = self.health.overall()
        chat = None if self._chat is None else self._service.generation.generative_models()
        payload = birth(self.device_id, self._version, self._service.model_names(), self._config,
                        self._settings.protocol, state, reason, chat)
        self._connection.publish(Outbound(self._status_topic, payload, 1, retain=True, content_type=JSON_TYPE))

    def _health_changed(self) -> None:
        """Any component's health changed: the retained status says "degraded" (and why) or "online" again."""
        if self._connection.connected and not self._stopping:
            self._publish_birth()

    def on_disconnected(self, reason: str) -> None:
        if self._stopping:
            log.info("mqtt: %s", reason)
        else:
            log.warning("mqtt: %s; results wait in the outbox", reason)
        self._outbox.set_connected(False)

    def on_acked(self, mid: int, ok: bool) -> None:
        if not self._outbox.on_acked(mid, ok) and not self._config.outbox.enabled:
            self._metrics.add("published")

    def on_message(self, message: Inbound) -> None:
        self._metrics.add("received")
        if message.retain:  # replayed at subscribe time: old state, not a new request
            self._metrics.drop("retained")
            self.ack(message)
            return
        command = self._commands.get(message.topic.removeprefix(self.prefix + "/"))
        if command is not None and message.topic.startswith(self.prefix + "/"):
            self.ack(message)
            command()
            return
        if self._chat is not None and message.topic == self._chat_topic:
            self._chat.accept(message, self._requests.reply_topic(message))
            return
        try:
            target = parse_infer_topic(self.prefix, message.topic)
        except PayloadError as e:
            self._requests.reject(message, e)
            return
        if target is not None:
            self._requests.accept(message, *target)
            return
        for pipeline in self._pipelines:
            captures = pipeline.match(message.topic)
            if captures is not None:
                pipeline.accept(message, captures)
                return
        self._metrics.drop("unrouted")
        self.ack(message)


def too_large(message: Outbound, size: int, limit: int) -> Outbound:
    """An ``{"error": ...}`` result in place of ``message``, with the same topic, correlation and message id (and
    the result's ``id`` and ``parameters`` when it is JSON)."""
    doc: Any = None
    if message.content_type == JSON_TYPE:
        with contextlib.suppress(orjson.JSONDecodeError):
            doc = orjson.loads(message.payload)
    doc = doc if isinstance(doc, dict) else {}
    parameters = doc.get("parameters") if isinstance(doc.get("parameters"), dict) else {"edged_message_id":
                                                                                       message.message_id}
    body = error_payload(f"the result is {size} bytes, more than the broker's Maximum Packet Size of {limit} "
                         "bytes; ask for fewer outputs or a smaller batch, or raise the broker's limit",
                         doc.get("id") if isinstance(doc.get("id"), str) else "", parameters)
    return dataclasses.replace(message, payload=body, content_type=JSON_TYPE, user_properties=())

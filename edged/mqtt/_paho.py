"""The broker connection: one connection, its network thread, reconnects and conversions. With ``_wire`` (paho's
client with edged's read path under it) the only modules that import paho-mqtt.

The network thread runs paho's ``loop()`` itself (rather than ``loop_start``) so that reconnects use our own
exponential backoff with full jitter, and so that a refused or dropped connection is never reported as
connected. Messages paho already took for QoS>=1 stay in paho's session and are retransmitted after a
reconnect; the durable outbox above covers restarts of the process.
"""

from __future__ import annotations

import logging
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edged.mqtt._message import Inbound, Outbound
from edged.mqtt._settings import ConnectionSettings
from edged.mqtt._tls import tls_context
from edged.mqtt._wire import PublishFields, WireClient
from edged.supervision import HealthBoard, SupervisedThread

log = logging.getLogger(__name__)


class Listener(Protocol):
    def on_connected(self, session_present: bool) -> None: ...
    def on_disconnected(self, reason: str) -> None: ...
    def on_message(self, message: Inbound) -> None: ...
    def on_acked(self, mid: int, ok: bool) -> None: ...


def backoff_delay(attempt: int, min_s: float, max_s: float, rng: random.Random) -> float:
    """Exponential backoff with full jitter: uniform in [min_s, min(max_s, min_s * 2**attempt)]."""
    ceiling = min(max_s, min_s * (2 ** min(attempt, 30)))
    return rng.uniform(min_s, max(min_s, ceiling))


class Connection:
    def __init__(self, settings: ConnectionSettings, listener: Listener, will: Outbound,
                 subscriptions: list[tuple[str, int]], health: HealthBoard | None = None, *,
                 stale: list[str] | None = None, on_unsubscribed: Callable[[], None] | None = None) -> None:
        """``stale``: filters an earlier run subscribed in this client's session and the config no longer has;
        they are unsubscribed on the first connect that finds the session present, then ``on_unsubscribed`` is
        called (on the network thread; also when the session was gone, so nothing was left to undo)."""
        self._settings = settings
        self._listener = listener
        self._subscriptions = subscriptions
        self._stale = list(stale or [])
        self._on_unsubscribed = on_unsubscribed
        self._unsubscribed_mid: int | None = None  # the UNSUBSCRIBE of the stale filters, until its UNSUBACK
        self._v5 = settings.protocol == "5"
        self._stopping = threading.Event()
        self._connected = threading.Event()
        self._thread: SupervisedThread | None = None
        self._health = (health or HealthBoard()).component("mqtt_network")
        self._failed = False  # the network loop raised: its connection is not to be trusted
        self._rng = random.Random()
        self.last_error = ""
        self.connects = 0
        self._attempt = 0
        self._stop_deadline = 0.0
        self._session_present: bool | None = None  # set by on_connect, announced after the CONNACK
        self._refusal = ""
        self._generation = 0
        self._network_ident = 0  # the network thread's id, once it runs
        self._subscribed_mid: int | None = None  # the SUBSCRIBE of this connection, until its SUBACK
        self._subscribed = False  # the broker acknowledged this connection's subscriptions: inputs reach us
        self._prototype = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        # v5: the broker's Maximum Packet Size from this connection's CONNACK (None: no limit given, or 3.1.1); a
        # larger PUBLISH makes the broker close the connection (MQTT 3.1.2.11.4)
        self.max_packet_size: int | None = None
        self._client = self._make_client(will)

    @property
    def v5(self) -> bool:
        return self._v5

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def subscribed(self) -> bool:
        """Connected and the broker has acknowledged the subscriptions (its SUBACK): a message published on an
        input topic from now on reaches edged. ``connected`` comes one round trip earlier."""
        return self._subscribed and self._unsubscribed_mid is None and self._connected.is_set()

    def on_network_thread(self) -> bool:
        """True in the thread that reads the broker's packets (callbacks run there): it must never wait for
        PUBACKs, which only it can read."""
        return threading.get_ident() == self._network_ident

    @property
    def reads(self) -> int:
        """System calls reading the broker's socket so far (counted by tests: one per burst, not per byte)."""
        return self._client.read_count()

    @property
    def wakes(self) -> int:
        """Wake-ups of the network thread to write what other threads queued (one per burst, not per packet)."""
        return self._client.wakes

    @property
    def slow_decodes(self) -> int:
        """Inbound PUBLISH and PUBACK packets that needed paho's own, slower decoders."""
        return self._client.slow_decodes

    # --- setup ---------------------------------------------------------------------------------------------
    def _make_client(self, will: Outbound) -> WireClient:
        s = self._settings
        client = WireClient(CallbackAPIVersion.VERSION2, client_id=s.client_id,
                            protocol=paho.MQTTv5 if self._v5 else paho.MQTTv311,
                            clean_session=None if self._v5 else False, reconnect_on_failure=False,
                            deliver=self._deliver)
        client.max_inflight_messages_set(0)  # the outbox bounds what is in flight
        client.max_queued_messages_set(0)
        client.manual_ack_set(True)  # an input is acknowledged only once its result is in the outbox
        if s.username is not None:
            client.username_pw_set(s.username, s.password)
        if s.tls:  # every file checked first, each failure naming its key (edged.mqtt._tls)
            client.tls_set_context(tls_context(s))
            client.tls_insecure_set(s.tls_insecure)
        client.will_set(will.topic, will.payload, will.qos, will.retain, self._properties(will))
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message  # QoS 2 only: WireClient delivers QoS 0 and 1 itself
        client.on_publish = self._on_publish
        client.on_subscribe = self._on_subscribe
        client.on_unsubscribe = self._on_unsubscribe
        client.on_socket_open = self._on_socket_open
        # With a callback here paho never writes to the socket from a publishing thread (it would, since we
        # run loop() ourselves and paho then sees no loop thread): two writers could interleave the halves of
        # partially written packets. The sockpair byte paho sends wakes our network thread, which writes.
        client.on_socket_register_write = self._on_register_write
        return client

    def _connect_properties(self) -> Properties | None:
        if not self._v5:
            return None
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = self._settings.session_expiry_s
        if self._settings.receive_maximum is not None:
            props.ReceiveMaximum = self._settings.receive_maximum
        if self._settings.maximum_packet_size is not None:
            props.MaximumPacketSize = self._settings.maximum_packet_size
        return props

    # --- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> None:
        s = self._settings
        if self._v5:
            self._client.connect_async(s.host, s.port, s.keepalive_s, clean_start=False,
                                       properties=self._connect_properties())
        else:
            self._client.connect_async(s.host, s.port, s.keepalive_s)
        self._thread = SupervisedThread("edged-mqtt-net", self._run, self._health,
                                        backoff_min_s=s.reconnect_min_s, backoff_max_s=s.reconnect_max_s)
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        """Disconnect cleanly (no last will) and end the network thread."""
        self._stop_deadline = time.monotonic() + timeout_s
        self._stopping.set()
        if self._thread is not None:
            self._thread.stop()
        if self._connected.is_set():
            self._client.disconnect()  # thread-safe; wakes the network thread out of its select()
        if self._thread is not None:
            self._thread.join(timeout_s + 1.0)

    def _run(self) -> None:
        self._network_ident = threading.get_ident()
        if self._failed:  # restarted by the supervisor: start over with a fresh connection
            self._mark_down("the network thread failed; reconnecting")
            if self._client.socket() is not None:
                self._try_connect()
        self._failed = True
        while not self._stopping.is_set():
            if self._client.socket() is None and not self._try_connect():
                self._backoff()
                continue
            rc = self._client.loop(timeout=1.0)
            self._announce_connect()
            if rc != paho.MQTT_ERR_SUCCESS and not self._stopping.is_set():
                self._mark_down(self._refusal or f"connection lost ({paho.error_string(rc)})")
                self._backoff()
            elif self._connected.is_set():
                self._health.ok()
        self._failed = False
        self._disconnect()

    def _announce_connect(self) -> None:
        """Tell the listener only once paho has finished with the CONNACK, which includes re-queueing its
        unacknowledged messages: anything published after that goes out behind them, in order."""
        session_present, self._session_present = self._session_present, None
        if session_present is not None and self._connected.is_set():
            self._listener.on_connected(session_present)

    def _backoff(self) -> None:
        s = self._settings
        self._stopping.wait(backoff_delay(self._attempt, s.reconnect_min_s, s.reconnect_max_s, self._rng))
        self._attempt += 1

    def _disconnect(self) -> None:
        if self._client.socket() is not None and self._connected.is_set():
            self._client.disconnect()
            while self._client.socket() is not None and time.monotonic() < self._stop_deadline:
                self._client.loop(timeout=0.05)
        self._connected.clear()

    def _try_connect(self) -> bool:
        try:
            self._client.reconnect()
            return True
        except (OSError, ssl.SSLError, ValueError, paho.WebsocketConnectionError) as e:
            reason = f"cannot connect to {self._settings.host}:{self._settings.port}: {e}"
            if reason != self.last_error:  # once per new reason: the backoff may retry the same failure for hours
                log.warning("mqtt: %s; retrying with backoff while results wait in the outbox (check that the "
                            "broker runs there, or fix [mqtt] broker)", reason)
            self._mark_down(reason)
            return False

    def _mark_down(self, reason: str) -> None:
        self.last_error = reason
        self._subscribed = False
        self._unsubscribed_mid = None  # unanswered: the stale filters are unsubscribed again at the next connect
        if self._connected.is_set():
            self._connected.clear()
            self._listener.on_disconnected(reason)

    # --- paho callbacks (network thread) -------------------------------------------------------------------
    def _on_register_write(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        """Nothing to do: the network thread's select() already watches the socket and the sockpair."""

    def _on_socket_open(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        _nodelay(sock)

    def _on_connect(self, client: paho.Client, userdata: Any, flags: Any, reason: ReasonCode,
                    properties: Any) -> None:
        if reason.is_failure:
            self.last_error = self._refusal = f"broker refused the connection: {reason}"
            log.warning("mqtt: %s", self.last_error)
            return
        _nodelay(client.socket())  # paho never sets TCP_NODELAY; Nagle costs ~40 ms per reply
        limit = getattr(properties, "MaximumPacketSize", None) if self._v5 else None
        self.max_packet_size = limit if isinstance(limit, int) and limit > 0 else None
        self._subscribed = not self._subscriptions
        if self._subscriptions:
            _, self._subscribed_mid = client.subscribe(self._subscriptions)
        if self._stale and flags.session_present:
            _, self._unsubscribed_mid = client.unsubscribe(self._stale)
        elif self._stale or self._on_unsubscribed is not None:
            self._unsubscribe_done()  # a new session holds no subscription of an earlier run
        self.connects += 1
        self._generation += 1
        self._attempt = 0
        self.last_error = self._refusal = ""
        self._connected.set()
        self._session_present = bool(flags.session_present)

    def _on_subscribe(self, client: paho.Client, userdata: Any, mid: int, reasons: Any, properties: Any) -> None:
        if mid == self._subscribed_mid:
            self._subscribed = True

    def _on_unsubscribe(self, client: paho.Client, userdata: Any, mid: int, reasons: Any,
                        properties: Any) -> None:
        if mid == self._unsubscribed_mid:
            log.info("mqtt: unsubscribed from %s, which the config no longer has", ", ".join(self._stale))
            self._unsubscribed_mid = None
            self._unsubscribe_done()

    def _unsubscribe_done(self) -> None:
        self._stale = []
        done, self._on_unsubscribed = self._on_unsubscribed, None
        if done is not None:
            done()

    def _on_disconnect(self, client: paho.Client, userdata: Any, flags: Any, reason: ReasonCode,
                       properties: Any) -> None:
        self._mark_down(f"disconnected: {reason}")

    def _on_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        props = getattr(msg, "properties", None)
        self._deliver(PublishFields(
            topic=msg.topic, payload=bytes(msg.payload), qos=msg.qos, retain=bool(msg.retain), dup=bool(msg.dup),
            mid=msg.mid, response_topic=getattr(props, "ResponseTopic", None),
            correlation_data=getattr(props, "CorrelationData", None),
            content_type=getattr(props, "ContentType", None),
            user_properties=tuple((str(k), str(v)) for k, v in getattr(props, "UserProperty", []) or [])))

    def _deliver(self, f: PublishFields) -> None:
        inbound = Inbound(f.topic, f.payload, f.qos, f.retain, f.response_topic, f.correlation_data,
                          f.content_type, f.user_properties, time.time_ns(), f.mid, self._generation, f.dup)
        try:
            self._listener.on_message(inbound)
        except Exception:  # a bug in one handler must not kill the network thread
            log.exception("mqtt: handling a message on %r failed", f.topic)

    def _on_publish(self, client: paho.Client, userdata: Any, mid: int, reason: ReasonCode,
                    properties: Any) -> None:
        self._listener.on_acked(mid, not reason.is_failure)

    def ack(self, message: Inbound) -> None:
        """PUBACK (PUBCOMP for QoS 2) an input; a no-op for QoS 0 and for messages of an earlier connection,
        which the broker redelivers anyway."""
        if message.qos and message.mid and message.generation == self._generation and self.connected:
            self._client.ack(message.mid, message.qos)

    # --- publishing ----------------------------------------------------------------------------------------
    def packet_size(self, message: Outbound) -> int:
        """The bytes of the PUBLISH packet that ``publish(message)`` sends."""
        properties = self._properties(message)
        packed = len(properties.pack()) if properties is not None else 0  # type: ignore[no-untyped-call]  # with its length
        length = 2 + len(message.topic.encode("utf-8")) + (2 if message.qos else 0) + packed + len(message.payload)
        return 1 + len(_variable_int(length)) + length

    def publish(self, message: Outbound) -> int | None:
        """Hand a message to paho; its mid, or None when it was not taken (never connected, bad topic, larger
        than the broker's Maximum Packet Size: the broker would close the connection)."""
        limit = self.max_packet_size
        if limit is not None and self.packet_size(message) > limit:
            log.warning("mqtt: not publishing %d bytes to %r: more than the broker's Maximum Packet Size of %d",
                        self.packet_size(message), message.topic[:200], limit)
            return None
        try:
            info = self._client.publish(message.topic, message.payload, message.qos, message.retain,
                                        self._properties(message))
        except (ValueError, TypeError) as e:
            log.warning("mqtt: cannot publish to %r: %s", message.topic, e)
            return None
        if info.rc not in (paho.MQTT_ERR_SUCCESS, paho.MQTT_ERR_NO_CONN):
            return None
        return int(info.mid)

    def _properties(self, message: Outbound) -> Properties | None:
        if not self._v5:
            return None
        user = list(message.user_properties)
        if message.message_id:
            user.append(("edged-message-id", message.message_id))
        return PublishProperties(self._prototype, message.content_type or None, message.correlation_data, user)


class PublishProperties(Properties):
    """The PUBLISH properties edged sets (content type, correlation data, user properties), packed byte for byte
    as paho packs them. paho's own class builds three tables per instance and scans all 42 property names for
    every attribute set and again in ``pack()``: a quarter of the daemon's CPU per QoS 1 message (py-spy). This
    one shares the tables of one prototype, so paho's other methods still work on it."""

    def __init__(self, prototype: Properties, content_type: str | None, correlation: bytes | None,
                 user: list[tuple[str, str]]) -> None:  # no super().__init__(): that is the cost avoided
        fields = self.__dict__
        fields.update(packetType=PacketTypes.PUBLISH, types=prototype.types, names=prototype.names,
                      properties=prototype.properties)
        if content_type is not None:
            fields["ContentType"] = content_type
        if correlation is not None:
            fields["CorrelationData"] = correlation
        if user:
            fields["UserProperty"] = user

    def pack(self) -> bytes:
        fields = self.__dict__
        if not fields.keys() <= _PACKED_HERE:  # another property was set (a client's ResponseTopic): paho packs it
            return bytes(super().pack())  # type: ignore[no-untyped-call]
        parts = []  # in paho's order: by property identifier
        if "ContentType" in fields:
            parts.append(b"\x03" + _string(fields["ContentType"]))
        if "CorrelationData" in fields:
            parts.append(b"\x09" + _string(fields["CorrelationData"]))
        parts += [b"\x26" + _string(key) + _string(value) for key, value in fields.get("UserProperty", ())]
        body = b"".join(parts)
        return _variable_int(len(body)) + body


_PACKED_HERE = frozenset({"packetType", "types", "names", "properties", "ContentType", "CorrelationData",
                          "UserProperty"})


def _string(value: str | bytes) -> bytes:
    data = value.encode("utf-8") if isinstance(value, str) else value
    return len(data).to_bytes(2, "big") + data


def _variable_int(value: int) -> bytes:
    out = bytearray()
    while True:
        value, byte = divmod(value, 128)
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)


def _nodelay(sock: Any) -> None:
    if sock is None:
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except (OSError, AttributeError):
        log.debug("mqtt: cannot set TCP_NODELAY on %r", sock)

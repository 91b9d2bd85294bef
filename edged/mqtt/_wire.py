"""paho's client with a buffered socket and edged's own decoders for the two packets of every QoS 1 message.

paho 2.2's network thread reads each packet with three ``recv`` calls (the command byte, the remaining length a
byte at a time, then the body), wraps every inbound PUBLISH in an ``MQTTMessage`` whose properties are a new
``Properties`` (three tables built per instance), and decodes every PUBACK into a ``ReasonCode`` and another
``Properties``: most of the daemon's CPU per message (docs/benchmarks.md). Here:

- ``BufferedSocket`` reads up to 64 KiB per ``recv`` and serves paho's small reads from its buffer. It reports
  the buffered bytes through ``pending()``, which paho's loop consults (as it does for an SSL socket) so that it
  never waits in ``select`` while a packet is already buffered.
- ``WireClient._handle_publish`` decodes a PUBLISH and the properties edged reads (ContentType, ResponseTopic,
  CorrelationData, UserProperty; PayloadFormatIndicator and MessageExpiryInterval are skipped) straight into
  ``PublishFields`` for one callback; a packet with any other property goes through paho's ``Properties``.
- ``WireClient._handle_pubackcomp`` decodes a PUBACK without properties into a shared ``ReasonCode``.
- ``WireClient._packet_queue`` wakes the network thread (a byte through paho's socket pair) only for the first
  packet queued since that thread last looked at its write queue, not for every packet: the outbox and the
  acknowledgements queue packets in groups. Safe because paho's loop calls ``want_write()`` (which re-arms the
  wake-up, then checks the queue) before every ``select``, and a producer appends before it checks the flag.

Everything else (connect, subscribe, QoS 2, the session, writes) is paho's. The private names relied on are
listed in ``PAHO_INTERNALS`` and checked by a test against the paho in use (pyproject pins the minor version).
"""

from __future__ import annotations

import contextlib
import logging
import ssl
from collections.abc import Callable
from typing import Any, NamedTuple

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edged.mqtt._message import UserProperties

log = logging.getLogger(__name__)
READ_SIZE = 64 * 1024
# paho.Client's private members this module overrides or calls, for the test that pins them
PAHO_INTERNALS = ("_create_socket", "_handle_publish", "_handle_pubackcomp", "_do_on_publish", "_send_puback",
                  "_in_packet", "_protocol", "_manual_ack", "_out_message_mutex", "_out_messages", "_transport",
                  "_sock_recv", "_loop", "_packet_queue", "_out_packet", "_sockpairW",
                  "_on_socket_register_write")
_MQTTV5 = paho.MQTTv5


class BufferedSocket:
    """A non-blocking TCP (or TLS) socket whose reads come from a buffer filled up to ``READ_SIZE`` at a time.

    One ``recv`` of the kernel socket per select wake-up while packets arrive faster than they are read; after a
    short read (the kernel had no more) the buffer reports "would block" without another system call until paho
    next asks ``pending()``, at the top of its loop, before ``select``.
    """

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._buffer = b""
        self._pos = 0  # what paho has read of the buffer: an offset, so that a read never copies the rest
        self._drained = False  # the last kernel read came back short: wait for select before the next one
        self.reads = 0  # recv calls of the kernel socket

    def recv(self, size: int) -> bytes:
        if self._pos >= len(self._buffer):
            if self._drained:
                raise BlockingIOError("no more data buffered; select first")
            self.reads += 1
            data: bytes = self._sock.recv(READ_SIZE)  # raises BlockingIOError / SSLWantReadError as paho expects
            self._drained = len(data) < READ_SIZE
            if len(data) <= size:
                return data
            self._buffer, self._pos = data, 0
        chunk = self._buffer[self._pos:self._pos + size]
        self._pos += len(chunk)
        return chunk

    def pending(self) -> int:
        self._drained = False  # paho's loop asks before select: the next kernel read follows a wake-up
        inner = self._sock.pending() if isinstance(self._sock, ssl.SSLSocket) else 0
        return len(self._buffer) - self._pos + inner

    def fileno(self) -> int:
        return int(self._sock.fileno())

    def __getattr__(self, name: str) -> Any:  # send, close, setblocking, setsockopt, ...: the socket's own
        return getattr(self._sock, name)


class PublishFields(NamedTuple):
    """One inbound PUBLISH as edged reads it (a tuple: a frozen dataclass's __init__ costs a setattr a field)."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    mid: int
    response_topic: str | None = None
    correlation_data: bytes | None = None
    content_type: str | None = None
    user_properties: UserProperties = ()


Deliver = Callable[[PublishFields], None]


class WireClient(paho.Client):
    """``deliver`` receives every inbound QoS 0 and QoS 1 PUBLISH (QoS 2 goes through paho's on_message after
    its PUBREL); ``slow_decodes`` counts the PUBLISH and PUBACK packets that needed paho's decoders."""

    def __init__(self, *args: Any, deliver: Deliver, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deliver = deliver
        self.slow_decodes = 0
        self.reads = 0  # kernel reads of sockets closed since, and of unbuffered ones; see read_count()
        self._buffered: BufferedSocket | None = None
        self._puback_reasons: dict[int, ReasonCode] = {}
        self._odd_codes: set[int] = set()  # PUBACK codes that are no PUBACK codes, logged once each
        self._no_properties = Properties(PacketTypes.PUBACK)  # type: ignore[no-untyped-call]
        self._wake_sent = False  # a wake-up byte is on its way to the network thread
        self.wakes = 0  # wake-up bytes sent

    def read_count(self) -> int:
        """Kernel ``recv`` calls of this client's sockets so far."""
        return self.reads + (self._buffered.reads if self._buffered is not None else 0)

    def _create_socket(self) -> Any:
        sock = super()._create_socket()
        if self._transport != "tcp":  # websockets frame their own reads
            return sock
        if self._buffered is not None:
            self.reads += self._buffered.reads
        self._buffered = BufferedSocket(sock)
        return self._buffered

    def _sock_recv(self, bufsize: int) -> bytes:
        if not isinstance(self._sock, BufferedSocket):  # counted here, each one a system call
            self.reads += 1
        return super()._sock_recv(bufsize)

    def want_write(self) -> bool:
        self._wake_sent = False  # before the check: a packet queued after it sends a new wake-up
        return super().want_write()

    def _packet_queue(self, command: int, packet: bytes | bytearray, mid: int, qos: int,
                      info: paho.MQTTMessageInfo | None = None) -> MQTTErrorCode:
        if self._on_socket_register_write is None:  # paho may write from the caller's thread: its own way
            return super()._packet_queue(command, packet, mid, qos, info)
        self._out_packet.append({"command": command, "mid": mid, "qos": qos, "pos": 0, "to_process": len(packet),
                                 "packet": packet, "info": info})
        if not self._wake_sent and self._sockpairW is not None:  # appended first: see the module docstring
            self._wake_sent = True
            self.wakes += 1
            with contextlib.suppress(BlockingIOError):  # the pair is full of wake-ups already
                self._sockpairW.send(b"0")
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def _handle_publish(self) -> MQTTErrorCode:
        header, packet = self._in_packet["command"], self._in_packet["packet"]
        qos = (header & 0x06) >> 1
        if qos == 2:
            return super()._handle_publish()
        try:
            fields = self._decode_publish(header, qos, bytes(packet))
        except (IndexError, ValueError, UnicodeDecodeError) as e:
            log.warning("mqtt: malformed PUBLISH from the broker: %s", e)
            return MQTTErrorCode.MQTT_ERR_PROTOCOL
        self._deliver(fields)
        if qos == 1 and not self._manual_ack:
            return self._send_puback(fields.mid)
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def _decode_publish(self, header: int, qos: int, packet: bytes) -> PublishFields:
        length = int.from_bytes(packet[0:2], "big")
        pos = 2 + length
        topic = packet[2:pos].decode("utf-8")
        mid = 0
        if qos:
            mid = int.from_bytes(packet[pos:pos + 2], "big")
            pos += 2
        retain, dup = bool(header & 0x01), bool(header & 0x08)
        if self._protocol != _MQTTV5:
            if not topic:
                raise ValueError("empty topic in an MQTT 3.1.1 PUBLISH")
            return PublishFields(topic, packet[pos:], qos, retain, dup, mid)
        start = pos
        size, pos = _variable_int(packet, pos)
        end = pos + size
        if end > len(packet):
            raise ValueError(f"properties of {size} bytes in a packet with {len(packet) - pos} left")
        found = _fast_properties(packet, pos, end)
        if found is None:
            self.slow_decodes += 1
            found = _paho_properties(packet[start:end])
        return PublishFields(topic, packet[end:], qos, retain, dup, mid, *found)

    def _handle_pubackcomp(self, cmd: Any) -> MQTTErrorCode:
        packet = self._in_packet["packet"]
        if (cmd == "PUBACK" and len(packet) >= 3 and self._protocol == _MQTTV5
                and self._puback_reason(packet[2]) is None):
            return self._odd_puback(int.from_bytes(packet[0:2], "big"), packet[2])
        if cmd != "PUBACK" or len(packet) > 3:  # PUBCOMP, or a PUBACK with properties: paho's decoder
            self.slow_decodes += cmd == "PUBACK"
            return super()._handle_pubackcomp(cmd)
        if len(packet) < 2:
            return MQTTErrorCode.MQTT_ERR_PROTOCOL
        mid = int.from_bytes(packet[0:2], "big")
        code = packet[2] if len(packet) == 3 and self._protocol == _MQTTV5 else 0
        reason = self._puback_reason(code)
        if reason is None:  # not reached: checked above
            return MQTTErrorCode.MQTT_ERR_PROTOCOL
        return self._published(mid, reason)

    def _puback_reason(self, code: int) -> ReasonCode | None:
        """paho's ReasonCode for a PUBACK's code, or None when paho's table has no such PUBACK code."""
        reason = self._puback_reasons.get(code)
        if reason is None:
            try:
                reason = self._puback_reasons[code] = ReasonCode(PacketTypes.PUBACK, identifier=code)
            except (KeyError, ValueError):
                return None
        return reason

    def _odd_puback(self, mid: int, code: int) -> MQTTErrorCode:
        """A PUBACK whose reason code is no PUBACK code (mosquitto answers a message past its message_size_limit
        with 0x95, packet too large): a refusal when 0x80 or above, as the spec reads any code. paho's decoder
        raised ValueError for it, in the network thread, on every resend of the message."""
        if code not in self._odd_codes:
            self._odd_codes.add(code)
            log.warning("mqtt: the broker answered a PUBLISH with PUBACK reason code 0x%02x, which is no PUBACK "
                        "code (0x95: packet too large, past mosquitto's message_size_limit); taken as %s", code,
                        "a refusal" if code >= 0x80 else "success")
        reason = self._puback_reason(0x80 if code >= 0x80 else 0x00)
        return self._published(mid, reason) if reason is not None else MQTTErrorCode.MQTT_ERR_PROTOCOL

    def _published(self, mid: int, reason: ReasonCode) -> MQTTErrorCode:
        with self._out_message_mutex:
            if mid in self._out_messages:
                return self._do_on_publish(mid, reason, self._no_properties)
        return MQTTErrorCode.MQTT_ERR_SUCCESS


Found = tuple[str | None, bytes | None, str | None, UserProperties]


def _fast_properties(packet: bytes, pos: int, end: int) -> Found | None:
    """The properties edged reads, or None when the block holds one this decoder does not know."""
    response = content = None
    correlation: bytes | None = None
    user: list[tuple[str, str]] = []
    while pos < end:
        ident = packet[pos]
        pos += 1
        if ident == 0x01:  # PayloadFormatIndicator: a byte
            pos += 1
        elif ident == 0x02:  # MessageExpiryInterval: four bytes
            pos += 4
        elif ident in (0x03, 0x08, 0x09, 0x26):
            value, pos = _binary(packet, pos, end)
            if ident == 0x26:
                name = value.decode("utf-8")
                value, pos = _binary(packet, pos, end)
                user.append((name, value.decode("utf-8")))
            elif ident == 0x09:
                correlation = value
            elif ident == 0x03:
                content = value.decode("utf-8")
            else:
                response = value.decode("utf-8")
        else:
            return None
    if pos != end:
        raise ValueError("a property runs past the end of the property block")
    return response, correlation, content, tuple(user)


def _paho_properties(block: bytes) -> Found:
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.unpack(block)  # type: ignore[no-untyped-call]
    user = tuple((str(k), str(v)) for k, v in getattr(props, "UserProperty", []) or [])
    return (getattr(props, "ResponseTopic", None), getattr(props, "CorrelationData", None),
            getattr(props, "ContentType", None), user)


def _binary(packet: bytes, pos: int, end: int) -> tuple[bytes, int]:
    stop = pos + 2 + int.from_bytes(packet[pos:pos + 2], "big")
    if stop > end:
        raise ValueError("a property value runs past the end of the property block")
    return packet[pos + 2:stop], stop


def _variable_int(packet: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    for _ in range(4):
        byte = packet[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise ValueError("a variable byte integer longer than four bytes")

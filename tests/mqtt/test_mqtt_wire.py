"""edged's paho subclass (edged/mqtt/_wire.py): its decoders agree with paho's, its buffered socket serves paho's
small reads and reports what it holds, its wake-ups cover every queued packet, and paho still has the private
members it relies on."""

from __future__ import annotations

import inspect
import socket
from importlib.metadata import version

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edged.mqtt._wire import PAHO_INTERNALS, BufferedSocket, PublishFields, WireClient


def test_paho_is_the_minor_version_whose_internals_wire_client_overrides() -> None:
    assert version("paho-mqtt").startswith("2.2."), version("paho-mqtt")
    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    missing = [name for name in PAHO_INTERNALS if not hasattr(client, name)]
    assert missing == []
    # the loop consults pending() before select, and calls want_write() before it (the wake-up protocol)
    loop = inspect.getsource(paho.Client._loop)
    assert loop.index("self.want_write()") < loop.index("pending()") < loop.index("socklist = select.select(")
    assert inspect.signature(paho.Client._packet_queue).parameters.keys() == {
        "self", "command", "packet", "mid", "qos", "info"}
    assert "self._in_packet['packet']" in inspect.getsource(paho.Client._packet_read)


def publish_packet(topic: str, payload: bytes, qos: int, props: Properties | None) -> tuple[int, bytes]:
    """(command byte, bytes after the fixed header) of a PUBLISH, its properties packed by paho."""
    name = topic.encode()
    body = len(name).to_bytes(2, "big") + name + ((7).to_bytes(2, "big") if qos else b"")
    if props is not None:
        body += props.pack()  # type: ignore[no-untyped-call]
    return 0x30 | qos << 1, body + payload


def decoded(header: int, body: bytes, v5: bool) -> tuple[list[PublishFields], int]:
    got: list[PublishFields] = []
    client = WireClient(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5 if v5 else paho.MQTTv311,
                        deliver=got.append)
    client.manual_ack_set(True)
    client._in_packet["command"], client._in_packet["packet"] = header, bytearray(body)
    assert client._handle_publish() == paho.MQTT_ERR_SUCCESS
    return got, client.slow_decodes


def test_publish_decodes_as_paho_does_with_and_without_the_properties_edged_reads() -> None:
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.ContentType = "application/json"
    props.ResponseTopic = "replies/ä"
    props.CorrelationData = b"\x00corr"
    props.UserProperty = [("timestamp", "12"), ("k", "v ✓")]
    props.PayloadFormatIndicator = 1
    props.MessageExpiryInterval = 60
    header, body = publish_packet("sensors/cam-1/frame", b"\x01payload", 1, props)
    [fields], slow = decoded(header, body, v5=True)
    assert slow == 0
    assert fields == PublishFields("sensors/cam-1/frame", b"\x01payload", 1, False, False, 7, "replies/ä",
                                   b"\x00corr", "application/json", (("timestamp", "12"), ("k", "v ✓")))
    header, body = publish_packet("a/b", b"", 1, Properties(PacketTypes.PUBLISH))  # type: ignore[no-untyped-call]
    assert decoded(header, body, v5=True) == ([PublishFields("a/b", b"", 1, False, False, 7)], 0)
    header, body = publish_packet("v3/topic", b"x" * 300, 0, None)
    assert decoded(header, body, v5=False) == ([PublishFields("v3/topic", b"x" * 300, 0, False, False, 0)], 0)


def test_a_property_edged_does_not_decode_itself_goes_through_paho_with_the_same_result() -> None:
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.SubscriptionIdentifier = 5
    props.ContentType = "text/plain"
    header, body = publish_packet("t", b"p", 1, props)
    [fields], slow = decoded(header, body, v5=True)
    assert slow == 1
    assert (fields.content_type, fields.payload, fields.mid) == ("text/plain", b"p", 7)


def test_a_publish_whose_properties_run_past_the_packet_is_a_protocol_error() -> None:
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.ContentType = "application/json"
    header, body = publish_packet("t", b"", 1, props)
    client = WireClient(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5, deliver=lambda f: None)
    client._in_packet["command"], client._in_packet["packet"] = header, bytearray(body[:-3])
    assert client._handle_publish() == paho.MQTT_ERR_PROTOCOL


def test_buffered_socket_serves_small_reads_from_one_recv_and_reports_them_pending() -> None:
    left, right = socket.socketpair()
    left.setblocking(False)
    try:
        wrapped = BufferedSocket(left)
        right.sendall(b"\x30\x05hello\x40\x02\x00\x01")
        assert wrapped.pending() == 0
        assert wrapped.recv(1) == b"\x30"
        assert (wrapped.recv(1), wrapped.recv(5), wrapped.recv(1), wrapped.recv(1), wrapped.recv(2)) == (
            b"\x05", b"hello", b"\x40", b"\x02", b"\x00\x01")
        with pytest.raises(BlockingIOError):  # the kernel had no more: no second system call until select
            wrapped.recv(1)
        assert wrapped.reads == 1
        right.sendall(b"\xd0\x00")
        assert wrapped.pending() == 0  # the top of paho's loop: the next read may ask the kernel again
        assert wrapped.recv(1) == b"\xd0"
        assert wrapped.reads == 2
        assert wrapped.pending() == 1  # buffered: paho's loop reads it without waiting in select
        assert wrapped.recv(5) == b"\x00"
        assert wrapped.fileno() == left.fileno()
    finally:
        left.close()
        right.close()


def test_one_wake_up_per_burst_of_queued_packets_and_a_new_one_after_the_loop_looked() -> None:
    client = WireClient(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5, deliver=lambda f: None)
    client.on_socket_register_write = lambda *args: None
    client.loop(timeout=0.0)  # creates paho's socket pair (no connection: returns at once)
    reader = client._sockpairR
    assert reader is not None
    reader.setblocking(False)
    client.want_write()  # what the network thread does before each select
    for mid in range(3):
        client._packet_queue(0x40, b"\x40\x02\x00\x01", mid, 0)
    assert reader.recv(100) == b"0"
    assert client.want_write()  # re-armed, and the three packets are still queued: select waits to write
    client._packet_queue(0x40, b"\x40\x02\x00\x02", 3, 0)
    assert reader.recv(100) == b"0"
    assert (client.wakes, len(client._out_packet)) == (2, 4)


def acked(packet: bytes) -> tuple[list[tuple[int, int]], int]:
    """(mid, reason code) per on_publish of a PUBACK for the in-flight message 9, and the slow decodes."""
    client = WireClient(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5, deliver=lambda f: None)
    client.on_socket_register_write = lambda *args: None
    got: list[tuple[int, int]] = []
    client.on_publish = lambda c, u, mid, reason, props: got.append((mid, reason.value))
    message = paho.MQTTMessage(mid=9)
    message.qos = 1
    client._out_messages[9] = message
    client._in_packet["command"], client._in_packet["packet"] = 0x40, bytearray(packet)
    assert client._handle_pubackcomp("PUBACK") == paho.MQTT_ERR_SUCCESS
    return got, client.slow_decodes


def test_puback_reason_codes_reach_on_publish_as_paho_decodes_them() -> None:
    assert acked(b"\x00\x09") == ([(9, 0)], 0)
    assert acked(b"\x00\x09\x10") == ([(9, 0x10)], 0)  # no matching subscribers: delivered, not a failure
    assert acked(b"\x00\x09\x97") == ([(9, 0x97)], 0)  # quota exceeded: a failure the outbox retries
    props = Properties(PacketTypes.PUBACK)  # type: ignore[no-untyped-call]
    props.ReasonString = "why"
    assert acked(b"\x00\x09\x80" + props.pack()) == ([(9, 0x80)], 1)  # type: ignore[no-untyped-call]
    assert acked(b"\x00\x05") == ([], 0)  # not in flight (a duplicate PUBACK): ignored, as paho does

"""edged's PUBLISH properties pack to exactly the bytes paho's own Properties class gives, and paho decodes them."""

from __future__ import annotations

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edged.mqtt._paho import PublishProperties

CASES = [
    (None, None, []),
    ("application/json", None, []),
    (None, b"\x00\x01corr", []),
    ("application/vnd.kserve", b"c" * 300, [("edged-message-id", "abc-1")]),
    ("text/plain; charset=utf-8", b"", [("k", "v"), ("clé", "värde ✓"), ("k", "repeated"), ("long", "x" * 200)]),
]


@pytest.mark.parametrize(("content_type", "correlation", "user"), CASES)
def test_publish_properties_pack_as_paho_does_and_decode_back(
        content_type: str | None, correlation: bytes | None, user: list[tuple[str, str]]) -> None:
    expected = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    if content_type is not None:
        expected.ContentType = content_type
    if correlation is not None:
        expected.CorrelationData = correlation
    if user:
        expected.UserProperty = user
    prototype = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    packed = PublishProperties(prototype, content_type, correlation, user).pack()
    assert packed == expected.pack()  # type: ignore[no-untyped-call]
    decoded = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    decoded.unpack(packed)  # type: ignore[no-untyped-call]
    assert getattr(decoded, "ContentType", None) == content_type
    assert getattr(decoded, "CorrelationData", None) == correlation
    assert getattr(decoded, "UserProperty", []) == user


def test_a_property_set_later_is_packed_too() -> None:
    """The load generator adds a ResponseTopic to edged's properties; it must reach the wire."""
    props = PublishProperties(Properties(PacketTypes.PUBLISH), "application/json", b"c",  # type: ignore[no-untyped-call]
                              [("edged-message-id", "m-1")])
    props.ResponseTopic = "replies/1"
    decoded = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    decoded.unpack(props.pack())  # type: ignore[no-untyped-call]
    assert decoded.ResponseTopic == "replies/1"
    assert (decoded.ContentType, decoded.CorrelationData) == ("application/json", b"c")

"""Transport-neutral MQTT messages: what the paho adapter hands in and what the front end hands out."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

UserProperties = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Inbound:
    topic: str
    payload: bytes
    qos: int
    retain: bool = False
    response_topic: str | None = None  # MQTT v5 only
    correlation_data: bytes | None = None  # MQTT v5 only
    content_type: str | None = None  # MQTT v5 only
    user_properties: UserProperties = ()
    received_ns: int = 0  # time.time_ns() when the adapter received it
    mid: int = 0  # the broker's packet id, for the manual PUBACK
    generation: int = 0  # which connection it arrived on; a PUBACK on a later one would ack the wrong message
    dup: bool = False  # the broker's DUP flag: it sent this message before (see _msgid)

    def user_property(self, key: str) -> str | None:
        """The first user property named ``key`` (case-insensitive, as HTTP headers are)."""
        wanted = key.lower()
        return next((v for k, v in self.user_properties if k.lower() == wanted), None)


@dataclass(frozen=True)
class Answer:
    """Which inbound message a result answers, remembered with the result so that its id survives a crash."""

    client: str
    mid: int
    ordinal: int
    digest: bytes
    # the connection the input arrived on (Inbound.generation); in memory only: -1 for answers of an earlier run
    generation: int = field(default=-1, compare=False)


@dataclass(frozen=True)
class Outbound:
    topic: str
    payload: bytes
    qos: int = 1
    retain: bool = False
    correlation_data: bytes | None = None
    content_type: str | None = None
    user_properties: UserProperties = ()
    message_id: str = ""  # edged's own id; duplicates after a redelivery carry the same one
    answers: Answer | None = None  # the input this result answers (stored in the same transaction)
    # called once the message is durable (outbox) or handed to paho (QoS 0): the input it answers may then
    # be acknowledged to the broker
    on_stored: Callable[[], None] | None = field(default=None, compare=False, repr=False)


def run_on_stored(messages: Iterable[Outbound]) -> None:
    """Every message's ``on_stored`` runs (each acknowledges an input) even if one raises; the first exception is
    raised afterwards, for the supervisor of the calling thread to count."""
    failure: Exception | None = None
    for message in messages:
        try:
            if message.on_stored is not None:
                message.on_stored()
        except Exception as e:
            failure = failure or e
    if failure is not None:
        raise failure

"""``edged_message_id``: one id for every redelivery of one inbound message, a new id for every new message.

The id of a QoS>=1 input is a digest of what the broker redelivers, nothing edged invents per process:
the salt of this state directory, the MQTT client id (which names the broker session), the packet id (mid),
a digest of topic and payload, and the mid's *ordinal*: how many distinct messages with this mid this
session had answered before. Per mid the front end remembers the last message it answered (its ordinal and
digest). An input with mid ``m`` then gets:

- ordinal ``n`` when it carries the DUP flag and the digest of the last message answered under ``m``
  (ordinal ``n``): it is that message again, sent because our PUBACK did not reach the broker;
- ordinal ``n + 1`` otherwise: a new message, since the broker reuses ``m`` only after it got our PUBACK
  for the previous one, or a redelivery of a message that was never answered (its first delivery computed
  ``n + 1`` from the same remembered state, so both copies agree);
- ordinal 0 for a mid never answered.

Why this holds across a crash (kill -9): the answered state of an input is written in the same outbox
transaction as its result, and the input is acknowledged only after that commit. So whenever a result is on
disk its input's state is too; whenever the state is not, neither is any result carrying the id, and the
redelivery recomputes the first delivery's ordinal from unchanged state. Two different messages with
identical payloads get different ids: they arrive under different mids, or under one mid with different
ordinals. No extra transaction per message: the state rides in the outbox's group commit.

QoS 0 inputs have no packet id and are never redelivered: they get ``<random per process>-<counter>``, unique
but not stable, which is all a message that is never repeated needs. When the broker session expires (or the
client id changes) redeliveries of the old session cannot happen; the remembered ordinals only ever grow, so
new messages still get new ids. The state is keyed by client id and lives as long as the outbox file; a new
outbox file gets a new salt, so ids of a replaced state directory never collide with earlier ones.

A broker that loses its own state breaks the DUP rule, and no client can undo that: mosquitto killed with -9
restarts from its last snapshot, in which an input edged has since answered and acknowledged may still wait
as never sent; it sends it again as a first delivery (no DUP flag), and its result goes out again under a new
id (reproduced with a restored snapshot in tests/mqtt/test_mqtt_replayed_inputs.py). Taking the same mid and
digest as the same message would be wrong the other way: brokers that reuse the lowest free packet id send
identical readings under one mid all day, and giving them one id would make consumers drop real results. So
the id follows the DUP flag, and such an input is counted (``inputs_replayed`` in the MQTT status,
``edged_mqtt_inputs_replayed_total``) and logged: the
last answer under its mid has its digest but was given on an earlier connection or by an earlier run, which a
genuine new message under a mid reused on the same connection never is.

Residual case, documented rather than hidden: with ``[mqtt.outbox] enabled = false`` (or QoS 0 results) the
state is not durable, so ids stay stable across reconnects but not across a crash. And a crash between our
PUBACK of message ``n`` and the broker's redelivery of the next message under the same mid, ``n + 1`` (65,535
messages later), with the *same topic and payload* as ``n``, gives ``n + 1`` the id of ``n``.
"""

from __future__ import annotations

import hashlib
import itertools
import secrets
import sqlite3
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edged.mqtt._message import Answer, Inbound

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS inbound_answered (client TEXT NOT NULL, mid INTEGER NOT NULL, "
    "ordinal INTEGER NOT NULL, digest BLOB NOT NULL, PRIMARY KEY (client, mid)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS outbox_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
)


def create_tables(db: sqlite3.Connection) -> str:
    """Create the id state tables if needed; the state directory's salt (made once, kept forever)."""
    for statement in _SCHEMA:
        db.execute(statement)
    db.execute("INSERT OR IGNORE INTO outbox_meta (key, value) VALUES ('id_salt', ?)", (secrets.token_hex(8),))
    return str(db.execute("SELECT value FROM outbox_meta WHERE key = 'id_salt'").fetchone()[0])


def load_answered(db: sqlite3.Connection, client: str) -> dict[int, tuple[int, bytes]]:
    rows = db.execute("SELECT mid, ordinal, digest FROM inbound_answered WHERE client = ?", (client,))
    return {int(mid): (int(ordinal), bytes(digest)) for mid, ordinal, digest in rows}


def record_answered(db: sqlite3.Connection, answers: Sequence[Answer]) -> None:
    """Inside the caller's transaction: the inputs these results answer. One statement for the whole group (the
    outbox counts statements per message); rows apply in order, so a mid answered twice keeps its later answer."""
    if not answers:
        return
    values = ", ".join(["(?, ?, ?, ?)"] * len(answers))
    db.execute(f"INSERT OR REPLACE INTO inbound_answered (client, mid, ordinal, digest) VALUES {values}",
               [field for a in answers for field in (a.client, a.mid, a.ordinal, a.digest)])


@dataclass(frozen=True)
class Identity:
    message_id: str
    answers: Answer | None  # None for QoS 0: nothing to remember


class MessageIds:
    def __init__(self, client: str, salt: str, answered: dict[int, tuple[int, bytes]],
                 on_replay: Callable[[Inbound], None] | None = None) -> None:
        self._client = client
        self._salt = salt
        # mid -> (ordinal, digest, connection generation of the input; -1 when answered by an earlier run)
        self._answered = {mid: (ordinal, digest, -1) for mid, (ordinal, digest) in answered.items()}
        self._on_replay = on_replay
        self._lock = threading.Lock()
        self._run = secrets.token_hex(6)
        self._counter = itertools.count(1)

    def fresh(self) -> str:
        """An id for something that is not an input (telemetry) or cannot be redelivered (QoS 0)."""
        return f"{self._run}-{next(self._counter)}"

    def identify(self, message: Inbound) -> Identity:
        if not message.qos or not message.mid:
            return Identity(self.fresh(), None)
        digest = hashlib.blake2b(message.topic.encode() + b"\0" + message.payload, digest_size=16).digest()
        with self._lock:
            last = self._answered.get(message.mid)
        if last is None:
            ordinal = 0
        elif message.dup and last[1] == digest:
            ordinal = last[0]
        else:
            ordinal = last[0] + 1
            if last[1] == digest and last[2] != message.generation and self._on_replay is not None:
                self._on_replay(message)  # a broker that lost its state sent an answered input as new
        key = f"{self._salt}\0{self._client}\0{message.mid}\0{ordinal}\0".encode() + digest
        return Identity(hashlib.blake2b(key, digest_size=10).hexdigest(),
                        Answer(self._client, message.mid, ordinal, digest, message.generation))

    def on_stored(self, answer: Answer, then: Callable[[], None] | None) -> Callable[[], None]:
        """Wrap a result's on_stored: remember the answer before the input is acknowledged."""
        def stored() -> None:
            with self._lock:
                self._answered[answer.mid] = (answer.ordinal, answer.digest, answer.generation)
            if then is not None:
                then()
        return stored

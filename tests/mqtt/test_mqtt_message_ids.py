"""The id rule of `MessageIds` over a real outbox file: what a reopened state directory answers to a redelivery
(DUP, same mid and digest), to a new message reusing the mid, and to QoS 0."""

from __future__ import annotations

from pathlib import Path

from edged.mqtt._message import Inbound, Outbound
from edged.mqtt._msgid import MessageIds
from edged.mqtt._store import OutboxStore


def ids_from(path: Path, client: str = "edged-dev", replays: list[Inbound] | None = None) -> MessageIds:
    store = OutboxStore(path, "batch", 0.0)
    try:
        return MessageIds(client, store.id_salt, store.answered(client),
                          on_replay=None if replays is None else replays.append)
    finally:
        store.close()


def store_result(path: Path, ids: MessageIds, message: Inbound) -> str:
    """Identify an input and store its result with the answer, as the front end does before the PUBACK."""
    ident = ids.identify(message)
    store = OutboxStore(path, "batch", 0.0)
    try:
        store.write([(Outbound("out", b"result", 1, message_id=ident.message_id, answers=ident.answers), 0.0, 0.0)],
                    [])
    finally:
        store.close()
    assert ident.answers is not None
    ids.on_stored(ident.answers, None)()
    return ident.message_id


def test_a_redelivery_after_a_reopen_gets_the_stored_id_and_a_reused_mid_a_new_one(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite3"
    first = store_result(path, ids_from(path), Inbound("in", b"same", 1, mid=7))
    reopened = ids_from(path)  # a kill -9 after the commit, before the PUBACK
    assert reopened.identify(Inbound("in", b"same", 1, mid=7, dup=True)).message_id == first
    # the broker got the PUBACK and later sends a new message, byte for byte the same, under mid 7
    assert reopened.identify(Inbound("in", b"same", 1, mid=7)).message_id != first


def test_an_input_never_answered_keeps_its_id_when_redelivered(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite3"
    store_result(path, ids_from(path), Inbound("in", b"earlier", 1, mid=3))
    before_crash = ids_from(path).identify(Inbound("in", b"next", 1, mid=3)).message_id
    after_crash = ids_from(path).identify(Inbound("in", b"next", 1, mid=3, dup=True)).message_id
    assert after_crash == before_crash


def test_identical_payloads_under_different_mids_or_clients_get_different_ids(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite3"
    ids = ids_from(path)
    one, two = (ids.identify(Inbound("in", b"same", 1, mid=mid)).message_id for mid in (1, 2))
    other_client = ids_from(path, "edged-other").identify(Inbound("in", b"same", 1, mid=1)).message_id
    assert len({one, two, other_client}) == 3


def test_a_new_state_directory_never_repeats_the_ids_of_an_old_one(tmp_path: Path) -> None:
    message = Inbound("in", b"same", 1, mid=1)
    old = ids_from(tmp_path / "old.sqlite3").identify(message).message_id
    assert ids_from(tmp_path / "new.sqlite3").identify(message).message_id != old


def test_qos0_inputs_get_unique_ids_without_state(tmp_path: Path) -> None:
    ids = ids_from(tmp_path / "outbox.sqlite3")
    got = [ids.identify(Inbound("in", b"same", 0)) for _ in range(3)]
    assert len({g.message_id for g in got}) == 3
    assert all(g.answers is None for g in got)


def test_an_answered_input_sent_again_as_new_on_a_later_connection_is_counted_a_replay(tmp_path: Path) -> None:
    """A broker restored from an old snapshot sends an input edged answered as a first delivery (no DUP): same
    mid and digest, a later connection. Its id follows the DUP flag (a new one); the replay is reported."""
    path = tmp_path / "outbox.sqlite3"
    replays: list[Inbound] = []
    ids = ids_from(path, replays=replays)
    first = store_result(path, ids, Inbound("in", b"reading", 1, mid=5, generation=1))
    replayed = Inbound("in", b"reading", 1, mid=5, generation=2)
    assert ids.identify(replayed).message_id != first
    assert replays == [replayed]
    # and by a later run: answers loaded from the file belong to no connection of this one
    again: list[Inbound] = []
    ids_from(path, replays=again).identify(Inbound("in", b"reading", 1, mid=5, generation=1))
    assert len(again) == 1


def test_identical_readings_under_one_mid_on_one_connection_are_new_messages_not_replays(tmp_path: Path) -> None:
    """Brokers that reuse the lowest free packet id send a sensor's identical readings under one mid: each is a
    new message with a new id, and none is reported as a replay; nor is a DUP redelivery or another payload."""
    path = tmp_path / "outbox.sqlite3"
    replays: list[Inbound] = []
    ids = ids_from(path, replays=replays)
    got = [store_result(path, ids, Inbound("in", b"closed", 1, mid=1, generation=3)) for _ in range(3)]
    assert len(set(got)) == 3
    assert ids.identify(Inbound("in", b"closed", 1, mid=1, generation=4, dup=True)).message_id == got[-1]
    ids.identify(Inbound("in", b"open", 1, mid=1, generation=4))
    assert replays == []

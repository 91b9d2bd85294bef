"""edged-update trusts nothing the edged user can write: a genuine hand-off made by the agent against nginx is
verified again with edged-update's own root; tampered bytes, a foreign root, metadata older than what it saw and
links in the hand-off are refused with their reason and change nothing. The databases a newer release migrated
are restored for the previous one; those it did not migrate keep what it wrote."""

from __future__ import annotations

import io
import json
import os
import shutil
import sqlite3
import tarfile
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import pytest

from edged.errors import UpdateRejected
from edged.ota._release import PLATFORM
from edged.ota._release_data import back_up, restore_migrated
from edged.ota._service import CommandManager
from edged.ota.fleet import FleetRepository
from edged.ota.release_apply import ReleaseApplier, Settings
from tests.ota.conftest import Device, Nginx
from tests.ota.test_ota_release import release_tarball


@pytest.fixture
def handed_off(tmp_path: Path, nginx: Nginx, fleet: FleetRepository) -> Device:
    device = Device(tmp_path, nginx.url, fleet.metadata_dir / "1.root.json",
                    release_work_dir=str(tmp_path / "update"))
    fleet.add_release(release_tarball(tmp_path, "0.9.0"))
    assert device.agent.check()["release"]["state"] == "handed_off"
    yield device  # type: ignore[misc]
    device.close()


def applier(device: Device, trusted_root: Path) -> ReleaseApplier:
    settings = Settings(device.state_dir / "ota" / "release", Path(device.config.release_work_dir), trusted_root,
                        "/nonexistent.sock", 5.0, (), str(device.state_dir.parent / "root"))
    # `false` fails any stop or start: these refusals happen before edged is touched
    return ReleaseApplier(settings, CommandManager("false {action}"))


def outcome(device: Device) -> dict[str, str]:
    return dict(json.loads((Path(device.config.release_work_dir) / "outcome.json").read_text()))


def test_tampered_release_bytes_in_the_hand_off_are_refused(handed_off: Device, fleet: FleetRepository) -> None:
    tarball = handed_off.state_dir / "ota" / "release" / "release.tar.gz"
    data = bytearray(tarball.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tarball.write_bytes(bytes(data))  # a compromised daemon swaps the release
    assert applier(handed_off, fleet.metadata_dir / "1.root.json").run() == "refused"
    found = outcome(handed_off)
    assert found["state"] == "refused" and "hash" in found["reason"], found
    assert not (handed_off.state_dir.parent / "root" / "opt").exists()  # nothing installed
    assert not (handed_off.state_dir / "ota" / "release").exists()  # consumed: the .path unit does not loop
    handed_off.agent.release.poll()
    assert handed_off.agent.status()["release"]["state"] == "refused"


def test_edged_update_verifies_with_its_own_root_not_the_one_in_the_hand_off(
        handed_off: Device, tmp_path: Path) -> None:
    other = FleetRepository.init(tmp_path / "other-fleet").root_file  # root.json in the hand-off is ignored
    assert applier(handed_off, other).run() == "refused"
    assert "signature" in outcome(handed_off)["reason"], outcome(handed_off)


def test_metadata_older_than_what_edged_update_saw_is_refused_as_a_rollback(
        handed_off: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    handoff = handed_off.state_dir / "ota" / "release"
    stale = tmp_path / "stale-handoff"
    shutil.copytree(handoff, stale)  # validly signed, but older than what edged-update will have seen
    digest = json.loads((handoff / "request.json").read_text())["sha256"]
    work = Path(handed_off.config.release_work_dir)
    work.mkdir(parents=True)
    (work / "outcome.json").write_text(json.dumps({"sha256": digest, "state": "refused", "reason": "operator"}))
    handed_off.agent.release.poll()
    (tmp_path / "newer").mkdir()
    fleet.add_release(release_tarball(tmp_path / "newer", "0.9.1"))
    assert handed_off.agent.check()["release"]["version"] == "0.9.1"
    run = applier(handed_off, fleet.metadata_dir / "1.root.json")
    run.manager = CommandManager("true {action}")
    assert run.run() == "rolled_back"  # verified; its install.sh (not a real one) fails, and it is undone
    assert "the install failed" in outcome(handed_off)["reason"]
    shutil.copytree(stale, handoff)
    assert run.run() == "refused"
    assert "rollback: metadata older than the trusted copy" in outcome(handed_off)["reason"], outcome(handed_off)


def test_links_in_the_hand_off_are_refused_and_never_followed(handed_off: Device, fleet: FleetRepository,
                                                             tmp_path: Path) -> None:
    secret = tmp_path / "root-only"
    secret.write_text("not for the edged user")
    tarball = handed_off.state_dir / "ota" / "release" / "release.tar.gz"
    tarball.unlink()
    os.symlink(secret, tarball)
    assert applier(handed_off, fleet.metadata_dir / "1.root.json").run() == "refused"
    assert "refused (a link or unreadable)" in outcome(handed_off)["reason"]
    copied = Path(handed_off.config.release_work_dir) / "incoming" / "release.tar.gz"
    assert not copied.exists()


def test_a_hand_off_folder_that_is_a_link_is_refused_and_only_the_link_removed(
        handed_off: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    handoff = handed_off.state_dir / "ota" / "release"
    elsewhere = tmp_path / "root-only-dir"
    handoff.rename(elsewhere)  # a genuine hand-off, but where root keeps its own files
    handoff.symlink_to(elsewhere)
    assert applier(handed_off, fleet.metadata_dir / "1.root.json").run() == "refused"
    assert "refused (a link or unreadable)" in outcome(handed_off)["reason"]
    assert not handoff.exists() and not handoff.is_symlink()
    assert (elsewhere / "request.json").is_file()  # the link's target was not touched


def test_an_ota_folder_that_is_a_link_is_refused_and_nothing_behind_it_is_removed(
        handed_off: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    """The edged user owns STATE_DIR/ota too: root must not follow a link there either. Before, edged-update
    refused the hand-off and then removed it by its path, through the link: root deleted a folder named
    release wherever the edged user pointed (edged-update also runs at every boot, with no hand-off needed)."""
    ota = handed_off.state_dir / "ota"
    elsewhere = tmp_path / "root-only-dir"
    ota.rename(elsewhere)  # holds release/ (a genuine hand-off), where root keeps its own files
    ota.symlink_to(elsewhere)
    assert applier(handed_off, fleet.metadata_dir / "1.root.json").run() == "refused"
    assert "refused (a link or unreadable)" in outcome(handed_off)["reason"]
    assert (elsewhere / "release" / "request.json").is_file()  # the link's target was not touched
    assert ota.is_symlink()  # nor the link: it is the daemon's to fix, root removes nothing through it


def _installing_release(where: Path, version: str) -> Path:
    """A release tarball whose install.sh makes ``version`` current under --root, as the real one does."""
    path = where / f"edged-{version}-{PLATFORM}.tar.gz"
    manifest = json.dumps({"version": version, "platform": PLATFORM, "python": "3.12", "extras": []}).encode()
    script = (f'#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = --root ] && root="$2"; shift; done\n'
              f'mkdir -p "$root/opt/edged/releases/{version}" && ln -sfn releases/{version} "$root/opt/edged/current"\n'
              ).encode()
    with tarfile.open(path, "w:gz") as tar:
        for name, data, mode in ((f"edged-{version}/manifest.json", manifest, 0o644),
                                 (f"edged-{version}/install.sh", script, 0o755)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return path


def test_starting_the_new_release_may_take_what_release_health_s_allows(
        tmp_path: Path, nginx: Nginx, fleet: FleetRepository) -> None:
    """`systemctl start` returns only once the daemon is READY (Type=notify), and a Jetson loading TensorRT engines
    takes minutes: the start is bounded by [ota] release_health_s, as README says. Before, edged-update killed it
    after a fixed 120 s (here the manager's 1 s) and rolled back a release that was still loading, whatever
    release_health_s said."""
    device = Device(tmp_path, nginx.url, fleet.metadata_dir / "1.root.json", release_work_dir=str(tmp_path / "update"))
    try:
        fleet.add_release(_installing_release(tmp_path, "0.9.0"))
        assert device.agent.check()["release"]["state"] == "handed_off"
        started = tmp_path / "started"
        run = applier(device, fleet.metadata_dir / "1.root.json")
        run.manager = CommandManager(f"sh -c 'if [ \"$0\" = start ]; then sleep 2 && touch {started}; fi' {{action}}",
                                     timeout_s=1.0)
        assert run.run() == "rolled_back"  # nothing answers on /nonexistent.sock: the health check fails
        reason = outcome(device)["reason"]
        assert started.exists(), reason  # the start ran to its end
        assert "service manager" not in reason, reason
        assert reason.startswith("edged 0.9.0 did not answer on its socket"), reason
        assert "within [ota] release_health_s 5 s" in reason, reason
    finally:
        device.close()


def _db(path: Path, version: int, rows: list[int]) -> None:
    with closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
        db.executemany("INSERT INTO t VALUES (?)", [(r,) for r in rows])
        db.execute(f"PRAGMA user_version = {version}")
        db.commit()


def _read(path: Path) -> tuple[int, list[int], list[str]]:
    with closing(sqlite3.connect(path)) as db:
        columns = [r[1] for r in db.execute("PRAGMA table_info(t)")]
        return (int(db.execute("PRAGMA user_version").fetchone()[0]),
                [r[0] for r in db.execute("SELECT x FROM t ORDER BY x")], columns)


def test_databases_a_newer_release_migrated_are_restored_the_others_keep_its_rows(tmp_path: Path) -> None:
    telemetry, outbox, absent = tmp_path / "telemetry.db", tmp_path / "mqtt-outbox.sqlite3", tmp_path / "none.db"
    _db(telemetry, 3, [1, 2])
    _db(outbox, 1, [10])
    versions = back_up([telemetry, outbox, absent], tmp_path / "backup")
    assert versions == {str(telemetry): 3, str(outbox): 1}
    with closing(sqlite3.connect(telemetry)) as db:  # the new release migrates telemetry to v4
        db.execute("ALTER TABLE t ADD COLUMN y TEXT")
        db.execute("PRAGMA user_version = 4")
        db.commit()
    _db(outbox, 1, [11])  # and queues a message without migrating the outbox
    restored = restore_migrated([telemetry, outbox, absent], tmp_path / "backup", versions)
    assert restored == [str(telemetry)]
    assert _read(telemetry) == (3, [1, 2], ["x"])  # the previous release finds the schema it knows
    assert _read(outbox) == (1, [10, 11], ["x"])  # nothing lost where nothing was migrated


def test_a_database_the_edged_user_replaced_with_a_link_is_neither_read_nor_written_by_root(
        tmp_path: Path) -> None:
    """The databases sit in edged's state directory: a compromised daemon can replace one with a link to a
    root-only SQLite file. Before, edged-update (root) copied that file into its backup folder, readable by the
    edged user (0644 in a 0755 folder), and a rollback wrote a backup back through such a link."""
    secret = tmp_path / "root-only" / "secrets.db"
    secret.parent.mkdir(mode=0o700)
    _db(secret, 7, [42])
    state = tmp_path / "state"
    state.mkdir()
    telemetry, outbox = state / "telemetry.db", state / "mqtt-outbox.sqlite3"
    telemetry.symlink_to(secret)
    _db(outbox, 1, [10])
    backup = tmp_path / "backup"
    with pytest.raises(UpdateRejected, match=f"backing up {telemetry}: a link"):
        back_up([telemetry, outbox], backup)
    assert not list(backup.glob("*telemetry*"))
    assert backup.stat().st_mode & 0o777 == 0o700  # what it holds is root's alone
    telemetry.unlink()
    _db(telemetry, 3, [1])
    versions = back_up([telemetry, outbox], backup)
    telemetry.unlink()
    telemetry.symlink_to(secret)  # replaced again before the rollback: the backup must not be written through it
    with pytest.raises(UpdateRejected, match=f"restoring {telemetry} for the previous release: a link"):
        restore_migrated([telemetry, outbox], backup, versions)
    assert _read(secret) == (7, [42], ["x"])


def _crashed_in(device: Device, state: str) -> None:
    """What a kill -9 of edged-update leaves: its journal at ``state`` (written before each step runs)."""
    request = json.loads((device.state_dir / "ota" / "release" / "request.json").read_text())
    work = Path(device.config.release_work_dir)
    work.mkdir(parents=True, exist_ok=True)
    (work / "journal.json").write_text(json.dumps({**request, "previous": "", "state": state}))


def test_a_database_that_cannot_be_restored_still_lets_the_previous_release_start(
        handed_off: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    """Before, a restore refused (here a link; a full disk alike) skipped the start of the previous release:
    edged and its socket stayed stopped until the next boot."""
    _crashed_in(handed_off, "checking")
    link = handed_off.state_dir / "telemetry.db"
    link.symlink_to(tmp_path / "elsewhere.db")
    journal = Path(handed_off.config.release_work_dir) / "journal.json"
    journal.write_text(json.dumps({**json.loads(journal.read_text()), "databases": {str(link): 1}}))
    run = applier(handed_off, fleet.metadata_dir / "1.root.json")
    started = tmp_path / "started"
    run.s = replace(run.s, databases=(link,))
    run.manager = CommandManager(f"sh -c 'if [ \"$0\" = start ]; then touch {started}; fi' {{action}}")
    assert run.run() == "rolled_back"
    assert started.exists(), outcome(handed_off)
    assert f"restoring {link} for the previous release: a link" in outcome(handed_off)["reason"]


def test_killed_before_the_install_edged_update_starts_over_from_the_hand_off(
        handed_off: Device, fleet: FleetRepository) -> None:
    _crashed_in(handed_off, "verified")
    run = applier(handed_off, fleet.metadata_dir / "1.root.json")
    run.manager = CommandManager("true {action}")
    assert run.run() == "rolled_back"
    # it took and verified the hand-off again, then ran the release's install.sh (this test release's fails)
    assert outcome(handed_off)["reason"].startswith("the install failed: [Errno 13] Permission denied")


@pytest.mark.parametrize("state", ["installing", "installed", "started", "checking", "rolling_back"])
def test_killed_during_or_after_the_install_edged_update_rolls_back(handed_off: Device, fleet: FleetRepository,
                                                                    state: str) -> None:
    _crashed_in(handed_off, state)
    run = applier(handed_off, fleet.metadata_dir / "1.root.json")
    run.manager = CommandManager("true {action}")
    assert run.run() == "rolled_back"
    assert outcome(handed_off)["reason"] == f"edged-update was interrupted while {state}: rolled back"
    assert not (Path(handed_off.config.release_work_dir) / "journal.json").exists()
    handed_off.agent.release.poll()
    assert handed_off.agent.status()["release"]["state"] == "rolled_back"

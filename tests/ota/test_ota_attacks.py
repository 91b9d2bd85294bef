"""Attacks on the update path, each against nginx serving a real TUF repository: refused with its reason in
the status, the target's hash remembered as bad where a target was at fault (never for bytes that failed its
signed hash: those condemn the download), and version 1 serving throughout."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from tuf.api._payload import Timestamp
from tuf.api.metadata import Metadata
from tuf.api.serialization.json import JSONSerializer

from edged.ota._keys import generate_key, load_signer
from edged.ota.fleet import FleetRepository
from tests.ota.conftest import Device, model_folder, vectors_for


def _add(fleet: FleetRepository, tmp: Path, **kwargs: object) -> str:
    folder = model_folder(tmp / "src", 2, seed=2)
    vectors = kwargs.pop("vectors", None) or vectors_for(2)
    return fleet.add_model(folder, 2, vectors, **kwargs)  # type: ignore[arg-type]


def _stored_target(fleet: FleetRepository) -> Path:
    (path,) = (fleet.targets_dir / "models" / "mlp").glob("*.2.tar")
    return path


def _resign_timestamp(fleet: FleetRepository, *, key: Path | None = None, expires: datetime | None = None) -> None:
    path = fleet.metadata_dir / "timestamp.json"
    md = Metadata.from_file(str(path))
    assert isinstance(md.signed, Timestamp)
    md.signed.version += 1
    md.signed.expires = expires or datetime.now(timezone.utc) + timedelta(days=1)
    md.sign(load_signer(key or fleet.keys_dir / "timestamp.pem"))
    path.write_bytes(md.to_bytes(JSONSerializer()))


def _refused_update(device: Device, words: str) -> dict[str, object]:
    status = device.agent.check()
    assert status["state"] == "refused", status
    assert words in str(status["reason"]), status["reason"]
    assert device.served_version() == "1"
    return status


def _refused_metadata(device: Device, words: str) -> None:
    status = device.agent.check()
    assert status["last_check"]["outcome"] == "refused", status  # type: ignore[index]
    assert words in status["last_check"]["reason"], status["last_check"]  # type: ignore[index]
    assert status["state"] == "idle"
    assert device.served_version() == "1"


def test_tampered_target_bytes_are_refused_and_the_genuine_target_installs_once_served(
        device: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    """Bytes that do not match the signed hash condemn the download, not the target (the hash they failed is the
    genuine one): a review found one corrupted response blacklisting the real update on every device for good."""
    name = _add(fleet, tmp_path)
    stored = _stored_target(fleet)
    genuine = stored.read_bytes()
    data = bytearray(genuine)
    data[len(data) // 2] ^= 0xFF
    stored.write_bytes(bytes(data))
    status = _refused_update(device, "hash")
    assert "retried at the next check" in str(status["reason"]) and status["bad_targets"] == 0
    assert name not in device.agent.check()["skipped"]  # tried again, refused again: not "known bad"
    stored.write_bytes(genuine)  # the mirror serves the signed bytes again
    installed = device.agent.check()
    assert installed["state"] in ("watching", "active"), installed
    assert device.served_version() == "2"


def test_endless_data_longer_than_the_metadata_says_is_refused_and_retried(device: Device, fleet: FleetRepository,
                                                                          tmp_path: Path) -> None:
    name = _add(fleet, tmp_path)
    stored = _stored_target(fleet)
    genuine = stored.read_bytes()
    with stored.open("ab") as f:
        f.write(b"\0" * 1_000_000)
    refused = _refused_update(device, "endless data")
    assert refused["bad_targets"] == 0
    assert refused["download"]["total_bytes"] == int(fleet.targets()[name]["length"])  # signed, not the claim
    assert not any(device.agent.client.fetcher.partial_dir.glob("*"))  # nothing kept to resume from
    stored.write_bytes(genuine)
    assert device.agent.check()["state"] in ("watching", "active")
    assert device.served_version() == "2"
    assert name not in device.agent.status()["skipped"]


def test_metadata_signed_with_a_wrong_key_is_refused(device: Device, fleet: FleetRepository,
                                                     tmp_path: Path) -> None:
    _add(fleet, tmp_path)
    _resign_timestamp(fleet, key=_foreign_key(tmp_path))
    _refused_metadata(device, "signature")


def _foreign_key(tmp_path: Path) -> Path:
    path = tmp_path / "attacker.pem"
    generate_key(path)
    return path


def test_rollback_to_older_metadata_is_refused(device: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    older = (fleet.metadata_dir / "timestamp.json").read_bytes()
    fleet.refresh()
    assert device.agent.check()["last_check"]["outcome"] == "ok"
    (fleet.metadata_dir / "timestamp.json").write_bytes(older)
    _refused_metadata(device, "rollback")


def test_an_expired_timestamp_freeze_is_refused(device: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    _add(fleet, tmp_path)
    _resign_timestamp(fleet, expires=datetime.now(timezone.utc) - timedelta(hours=1))
    _refused_metadata(device, "expired")
    # expiry is judged by this device's clock: one running days ahead reads the same, so the reason says what
    # the clock reads (before, it blamed only a freeze attack or the repository, on one device of a healthy fleet)
    reason = device.agent.status()["last_check"]["reason"]
    assert "or this device's clock running ahead (it reads " in reason, reason
    assert "set the clock (NTP or an RTC) if it is wrong" in reason, reason


def test_a_mix_and_match_snapshot_is_refused(device: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    _add(fleet, tmp_path)  # snapshot 2 names the targets with the new model
    newest = max(int(p.name.split(".")[0]) for p in fleet.metadata_dir.glob("*.snapshot.json"))
    # the attacker serves the older signed snapshot under the name the timestamp points to
    (fleet.metadata_dir / f"{newest}.snapshot.json").write_bytes(
        (fleet.metadata_dir / f"{newest - 1}.snapshot.json").read_bytes())
    _refused_metadata(device, "mix-and-match")


def test_an_incompatible_target_is_skipped_with_the_reason(device: Device, fleet: FleetRepository,
                                                           tmp_path: Path) -> None:
    name = _add(fleet, tmp_path, compat={"min_edged_version": "99.0"})
    status = device.agent.check()
    assert status["state"] == "idle"
    assert "incompatible: needs edged >= 99.0" in status["skipped"][name]  # type: ignore[index]
    assert device.served_version() == "1"


def test_a_device_outside_the_wave_skips_the_target_until_promoted(device: Device, fleet: FleetRepository,
                                                                   tmp_path: Path) -> None:
    name = _add(fleet, tmp_path, percent=0)
    status = device.agent.check()
    assert "not in this wave" in status["skipped"][name], status  # type: ignore[index]
    assert device.served_version() == "1"
    fleet.promote(name, 100)
    assert device.agent.check()["state"] == "active"
    assert device.served_version() == "2"


def test_a_model_whose_test_vectors_fail_is_refused(device: Device, fleet: FleetRepository,
                                                    tmp_path: Path) -> None:
    _add(fleet, tmp_path, vectors=vectors_for(2, offset=1.0))
    _refused_update(device, "differs from the expected values")
    assert not (device.repository / "mlp" / "2").exists()  # never entered the served repository


@pytest.mark.parametrize("key", ["module", "tensorrt"])
def test_hardware_bound_targets_are_incompatible_on_a_device_without_that_hardware(
        device: Device, fleet: FleetRepository, tmp_path: Path, key: str) -> None:
    name = _add(fleet, tmp_path, compat={key: "orin-nano" if key == "module" else "10.3"})
    assert "incompatible" in device.agent.check()["skipped"][name]  # type: ignore[index]


def test_after_a_key_rotation_devices_follow_the_new_root_and_refuse_the_old_key(
        device: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    assert device.agent.check()["last_check"]["outcome"] == "ok"  # type: ignore[index]
    retired = fleet.keys_dir / "timestamp.pem"
    old_key = tmp_path / "old-timestamp.pem"
    old_key.write_bytes(retired.read_bytes())
    fleet.rotate_key("timestamp")
    _add(fleet, tmp_path)
    assert device.agent.check()["state"] == "active"  # 2.root.json was fetched and trusted on the way
    assert device.served_version() == "2"
    _resign_timestamp(fleet, key=old_key)
    status = device.agent.check()
    assert status["last_check"]["outcome"] == "refused" and "signature" in status["last_check"]["reason"]  # type: ignore[index]


def test_a_rotated_root_key_is_trusted_through_the_old_one(device: Device, fleet: FleetRepository,
                                                           tmp_path: Path) -> None:
    assert device.agent.check()["last_check"]["outcome"] == "ok"  # type: ignore[index]
    fleet.rotate_key("root")
    fleet.rotate_key("targets")  # signed by the new root key alone: only valid once 2.root.json is trusted
    _add(fleet, tmp_path)
    assert device.agent.check()["state"] == "active"


def _signed_bundle(fleet: FleetRepository, tmp: Path, name: str, custom: dict[str, object],
                   members: dict[str, bytes]) -> None:
    import io
    import tarfile

    bundle = tmp / "odd-bundle.tar"
    with tarfile.open(bundle, "w") as tar:
        for member, data in members.items():
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    fleet._add_target(name, bundle, {"compat": {}, "percent": 100, "cohort_salt": "s", **custom})


@pytest.mark.parametrize(("model", "version", "words"), [
    (".", 2, "model name '.' starts with '.'"),
    ("..", 2, "model name '..' starts with '.'"),
    ("mlp", "two", "version 'two': expected a whole number above 0"),
    ("mlp", 0, "version 0: expected a whole number above 0"),
])
def test_a_signed_target_naming_no_usable_model_folder_or_version_is_skipped_with_the_reason(
        device: Device, fleet: FleetRepository, tmp_path: Path, model: str, version: object, words: str) -> None:
    """The targets role is trusted, yet what it names becomes a path on the device: checked before anything is
    downloaded. Before, a version that is not a number stopped every check with a 500 (ValueError: int()), so
    no update reached the device while that target was signed; a model "." or ".." was downloaded and only
    refused by the staging load."""
    source = model_folder(tmp_path / "src", 2, seed=2)
    members = {f"{model}/config.pbtxt": (source / "config.pbtxt").read_bytes(),
               f"{model}/{version}/model.onnx": (source / "2" / "model.onnx").read_bytes(),
               "test_vectors.json": vectors_for(2)}
    _signed_bundle(fleet, tmp_path, f"models/0odd/{version}.tar", {"kind": "model", "model": model,
                                                                   "version": version}, members)
    good = _add(fleet, tmp_path)  # a genuine update beside it still installs
    status = device.agent.check()
    assert words in status["skipped"][f"models/0odd/{version}.tar"], status["skipped"]  # type: ignore[index]
    assert status["state"] == "active" and status["target"] == good, status
    assert device.served_version() == "2"
    assert sorted(p.name for p in device.repository.iterdir()) == ["mlp"]

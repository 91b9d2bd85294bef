"""The operator's side: a TUF repository of model bundles, kept as static files any web server or CDN serves.

Layout: ``REPO/metadata/`` (consistent snapshots: ``N.root.json``, ``N.targets.json``, ``N.snapshot.json``
and ``timestamp.json``) and ``REPO/targets/`` (``models/<model>/<sha256>.<version>.tar`` and daemon releases,
``releases/<platform>/<sha256>.<version>.tar.gz``), all public; the
private keys live beside it in ``REPO.keys/`` (never served; root's belongs offline once initialised).
Every metadata change signs a new targets (when targets change), snapshot and timestamp, in that order, so a
device never sees a timestamp naming a snapshot that is not there yet.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, cast

from securesystemslib.signer._crypto_signer import CryptoSigner
from tuf.api._payload import MetaFile, Root, Snapshot, T, TargetFile, Targets, Timestamp
from tuf.api.metadata import Metadata
from tuf.api.serialization.json import JSONSerializer

from edged.errors import UpdateRejected
from edged.ota._bundle import build_bundle
from edged.ota._durable import write_atomic
from edged.ota._engine import check_build_spec
from edged.ota._keys import generate_key, load_signer

ROLES = ("root", "targets", "snapshot", "timestamp")
EXPIRY = {"root": timedelta(days=365), "targets": timedelta(days=90), "snapshot": timedelta(days=7),
          "timestamp": timedelta(days=1)}
COMPAT_KEYS = ("module", "jetpack", "l4t", "tensorrt", "min_edged_version")


@dataclass(frozen=True)
class InitResult:
    root_keys: list[Path]
    root_file: Path


def _expires(role: str) -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0) + EXPIRY[role]


class FleetRepository:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.metadata_dir = path / "metadata"
        self.targets_dir = path / "targets"
        # beside the repository, never in it: REPO is served as it is, and its keys must not be
        self.keys_dir = path.parent / f"{path.name}.keys"

    # --- creation ------------------------------------------------------------------------------------------
    @classmethod
    def init(cls, path: Path, threshold: int = 1) -> InitResult:
        if threshold < 1:
            raise UpdateRejected(f"--threshold must be at least 1, found {threshold}")
        repo = cls(path)
        if repo.metadata_dir.exists():
            raise UpdateRejected(f"{repo.metadata_dir} exists already: this is a repository; refusing to "
                                 "overwrite its keys")
        if repo.keys_dir.exists():
            raise UpdateRejected(f"{repo.keys_dir} exists already: refusing to overwrite another repository's keys")
        root_paths = [repo.keys_dir / f"root-{i + 1}.pem" for i in range(threshold)]
        root_signers = [generate_key(p) for p in root_paths]
        signers = {role: generate_key(repo.keys_dir / f"{role}.pem") for role in ROLES[1:]}
        root = Root(expires=_expires("root"), consistent_snapshot=True)
        for signer in root_signers:
            root.add_key(signer.public_key, "root")
        root.roles["root"].threshold = threshold
        for role, signer in signers.items():
            root.add_key(signer.public_key, role)
        root_md = Metadata(root)
        for signer in root_signers:
            root_md.sign(signer, append=True)
        repo.metadata_dir.mkdir(parents=True)
        repo.targets_dir.mkdir(parents=True, exist_ok=True)
        repo._write(root_md, "root")
        write_atomic(repo.metadata_dir / "root.json", root_md.to_bytes(JSONSerializer(compact=False)))
        repo._write_signed(Metadata(Targets(expires=_expires("targets"))), "targets")
        repo._publish()
        return InitResult(root_paths, repo.metadata_dir / "1.root.json")

    # --- targets -------------------------------------------------------------------------------------------
    def add_model(self, model_dir: Path, version: int, vectors: bytes, percent: int = 100,
                  compat: dict[str, str] | None = None, cohort_salt: str | None = None,
                  build_spec: bytes | None = None) -> str:
        """``cohort_salt``: targets sharing one reach the same devices first (a stable canary group); None: a
        random salt, so each target's first wave is a different share of the fleet."""
        _check_percent(percent)
        if cohort_salt is not None and not cohort_salt.strip():
            raise UpdateRejected("--cohort-salt: expected a non-empty string")
        _check_compat(compat)
        name = f"models/{model_dir.name}/{version}.tar"
        with tempfile.TemporaryDirectory() as scratch:
            bundle = Path(scratch) / "bundle.tar"
            if build_spec is not None:
                check_build_spec(build_spec)
            build_bundle(model_dir, version, vectors, bundle, build_spec)
            custom = {"kind": "model", "model": model_dir.name, "version": version, "compat": dict(compat or {}),
                      "percent": percent,
                      "cohort_salt": secrets.token_hex(8) if cohort_salt is None else cohort_salt}
            self._add_target(name, bundle, custom)
        return name

    def add_release(self, tarball: Path, percent: int = 100, compat: dict[str, str] | None = None) -> str:
        """Sign a daemon release (the offline tarball of ``packaging/build-tarball``) as target
        ``releases/<platform>/<version>.tar.gz``; its manifest names the version and the platform."""
        _check_percent(percent)
        _check_compat(compat)
        version, platform = release_manifest(tarball)
        name = f"releases/{platform}/{version}.tar.gz"
        custom = {"kind": "release", "version": version, "platform": platform, "compat": dict(compat or {}),
                  "percent": percent, "cohort_salt": secrets.token_hex(8)}
        self._add_target(name, tarball, custom)
        return name

    def _add_target(self, name: str, source: Path, custom: dict[str, Any]) -> None:
        target = TargetFile.from_file(name, str(source), ["sha256"])
        target.unrecognized_fields["custom"] = custom
        folder, _, base = name.rpartition("/")
        stored = self.targets_dir / folder / f"{target.hashes['sha256']}.{base}"  # consistent snapshot naming
        stored.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, stored)
        targets = self._latest(Targets, "targets")
        targets.signed.targets[name] = target
        self._bump(targets, "targets")
        self._publish()

    def promote(self, name: str, percent: int) -> dict[str, Any]:
        _check_percent(percent)
        targets = self._latest(Targets, "targets")
        target = targets.signed.targets.get(name)
        if target is None:
            known = ", ".join(sorted(targets.signed.targets)) or "none"
            raise UpdateRejected(f"no target {name!r} in the repository (targets: {known})")
        custom = dict(target.unrecognized_fields.get("custom", {}))
        custom["percent"] = percent
        target.unrecognized_fields["custom"] = custom
        self._bump(targets, "targets")
        self._publish()
        return custom

    def targets(self) -> dict[str, dict[str, Any]]:
        targets = self._latest(Targets, "targets")
        return {name: {"length": t.length, "sha256": t.hashes.get("sha256", ""),
                       **t.unrecognized_fields.get("custom", {})} for name, t in targets.signed.targets.items()}

    def refresh(self) -> tuple[int, int]:
        """Re-sign snapshot and timestamp (new versions, new expiry): run before the timestamp expires."""
        return self._publish()

    def rotate_key(self, role: str) -> Path:
        """A new key for ``role``: a new root version lists it instead of the old one, signed by the root keys
        (for root: by the old and the new, so devices trusting either accept it); then the role is re-signed."""
        if role not in ROLES:
            raise UpdateRejected(f"rotate-key: unknown role {role!r} (roles: {', '.join(ROLES)})")
        root = self._latest(Root, "root")
        old_signers = [load_signer(p) for p in self._root_key_files()]
        name = "root-1.pem" if role == "root" else f"{role}.pem"
        path = self.keys_dir / name
        retired = path.with_name(f"{path.name}.retired-v{root.signed.version}")
        path.replace(retired)
        new = generate_key(path)
        for keyid in list(root.signed.roles[role].keyids):
            if role != "root" or keyid == load_signer(retired).public_key.keyid:
                root.signed.revoke_key(keyid, role)
        root.signed.add_key(new.public_key, role)
        root.signed.version += 1
        root.signed.expires = _expires("root")
        root.signatures.clear()
        signers = [*old_signers, new] if role == "root" else old_signers
        for signer in signers:
            root.sign(signer, append=True)
        self._write(root, "root")
        write_atomic(self.metadata_dir / "root.json", root.to_bytes(JSONSerializer(compact=False)))
        if role == "targets":
            self._bump(self._latest(Targets, "targets"), "targets")
        self._publish()
        return path

    def _root_key_files(self) -> list[Path]:
        files = sorted(self.keys_dir.glob("root-*.pem"))
        if not files:
            raise UpdateRejected(f"{self.keys_dir}: no root-*.pem: bring the offline root keys back to rotate a key")
        return files

    # --- signing -------------------------------------------------------------------------------------------
    def _publish(self) -> tuple[int, int]:
        targets = self._latest(Targets, "targets")
        snapshot = self._latest_or_none(Snapshot, "snapshot") or Metadata(_unversioned(Snapshot()))
        snapshot.signed.meta["targets.json"] = MetaFile(version=targets.signed.version)
        self._bump(snapshot, "snapshot")
        timestamp = self._timestamp_or_none() or Metadata(_unversioned(Timestamp()))
        raw = (self.metadata_dir / f"{snapshot.signed.version}.snapshot.json").read_bytes()
        timestamp.signed.snapshot_meta = MetaFile(version=snapshot.signed.version, length=len(raw),
                                                  hashes={"sha256": hashlib.sha256(raw).hexdigest()})
        timestamp.signed.version += 1
        timestamp.signed.expires = _expires("timestamp")
        timestamp.sign(self._signer("timestamp"))
        write_atomic(self.metadata_dir / "timestamp.json", timestamp.to_bytes(JSONSerializer(compact=False)))
        return snapshot.signed.version, timestamp.signed.version

    def _bump(self, md: Metadata[Any], role: str) -> None:
        md.signed.version += 1
        md.signed.expires = _expires(role)
        self._write_signed(md, role)

    def _write_signed(self, md: Metadata[Any], role: str) -> None:
        md.sign(self._signer(role))
        self._write(md, role)

    def _write(self, md: Metadata[Any], role: str) -> None:
        write_atomic(self.metadata_dir / f"{md.signed.version}.{role}.json",
                     md.to_bytes(JSONSerializer(compact=False)))

    def _signer(self, role: str) -> CryptoSigner:
        return load_signer(self.keys_dir / f"{role}.pem")

    def _latest(self, kind: type[T], role: str) -> Metadata[T]:
        found = self._latest_or_none(kind, role)
        if found is None:
            raise UpdateRejected(f"{self.metadata_dir}: no {role} metadata; is this a repository made by "
                                 "`edged fleet init`?")
        return found

    def _latest_or_none(self, kind: type[T], role: str) -> Metadata[T] | None:
        versions = [int(p.name.split(".", 1)[0]) for p in self.metadata_dir.glob(f"*.{role}.json")
                    if p.name.split(".", 1)[0].isdigit()]
        if not versions:
            return None
        md = Metadata.from_file(str(self.metadata_dir / f"{max(versions)}.{role}.json"))
        if not isinstance(md.signed, kind):
            raise UpdateRejected(f"{role} metadata: expected {kind.__name__}, found {type(md.signed).__name__}")
        return md

    def _timestamp_or_none(self) -> Metadata[Timestamp] | None:
        path = self.metadata_dir / "timestamp.json"
        return cast("Metadata[Timestamp]", Metadata.from_file(str(path))) if path.exists() else None


def _unversioned(signed: T) -> T:
    signed.version = 0  # the first publish bumps it to 1; the constructor refuses 0
    return signed


def _check_percent(percent: int) -> None:
    if not 0 <= percent <= 100:
        raise UpdateRejected(f"--percent must be between 0 and 100, found {percent}")


def _check_compat(compat: dict[str, str] | None) -> None:
    unknown = sorted(set(compat or {}) - set(COMPAT_KEYS))
    if unknown:
        raise UpdateRejected(f"--compat {unknown[0]}: unknown key (known: {', '.join(COMPAT_KEYS)})")


def release_manifest(tarball: Path) -> tuple[str, str]:
    """(version, platform) from ``edged-<version>/manifest.json`` inside a release tarball."""
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            member = next((m for m in tar if m.isfile() and m.name.count("/") == 1
                           and m.name.endswith("/manifest.json")), None)
            stream = tar.extractfile(member) if member is not None else None
            doc = json.loads(stream.read(1 << 20)) if stream is not None else None
    except (OSError, tarfile.TarError, ValueError) as e:
        raise UpdateRejected(f"{tarball}: not a release tarball of packaging/build-tarball: {e}") from e
    if not isinstance(doc, dict):
        raise UpdateRejected(f"{tarball}: no edged-<version>/manifest.json: not a tarball of packaging/build-tarball")
    version, platform = doc.get("version"), doc.get("platform")
    if not isinstance(version, str) or not version or not isinstance(platform, str) or not platform \
            or "/" in version + platform:
        raise UpdateRejected(f"{tarball}: manifest.json needs a version and a platform, found {version!r}, "
                             f"{platform!r}")
    return version, platform


def describe_targets(targets: dict[str, dict[str, Any]]) -> str:
    return json.dumps(targets, indent=2, sort_keys=True)

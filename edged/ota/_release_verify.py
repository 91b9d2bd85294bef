"""edged-update's own verification of a hand-off: nothing the edged user could write is trusted.

`take` copies the hand-off out of the edged-writable state directory into edged-update's root-only folder,
opening every folder and file relative to the one above it without following links and refusing anything but
regular files of bounded size, so a compromised daemon cannot make root read or write elsewhere. `verify`
then runs python-tuf's ngclient over that copy (`HandoffFetcher` answers its requests from the copied files,
as if it were the repository) against edged-update's own trusted root (``[ota] root_file``, root-owned) and
its own metadata cache: signatures, thresholds, versions (no rollback below what edged-update itself saw),
expiry and the tarball's length and hash are all decided again, here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tuf.api import exceptions
from tuf.api._payload import TargetFile
from tuf.ngclient.fetcher import FetcherInterface
from tuf.ngclient.updater import Updater

from edged.errors import UpdateRejected
from edged.ota._client import clock_problem, translated
from edged.ota._release import PLATFORM, REQUEST, TARBALL

MAX_METADATA_BYTES = 4 * 1024 * 1024
MAX_ROOTS = 1000
CHUNK = 1024 * 1024
MAX_REMOVE_DEPTH = 4  # release/metadata/<file>: a hand-off is two folders deep
BASE = "http://handoff.invalid/"  # never fetched: HandoffFetcher answers every URL from the copied files


def read_request(handoff: Path) -> dict[str, str] | None:
    """The request the daemon dropped, or None when there is none (nothing to do)."""
    try:
        folder = _open_dir(handoff)
    except FileNotFoundError:
        return None
    try:
        raw = _read_regular(folder, REQUEST, handoff, 64 * 1024)
    except FileNotFoundError:
        return None
    finally:
        os.close(folder)
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise UpdateRejected(f"{handoff / REQUEST}: not JSON: {e}") from e
    if not isinstance(doc, dict) or not all(isinstance(doc.get(k), str) for k in ("target", "sha256", "version")):
        raise UpdateRejected(f"{handoff / REQUEST}: expected target, sha256 and version strings")
    return {k: str(doc[k]) for k in ("target", "sha256", "version")}


def take(handoff: Path, copy: Path) -> None:
    """Copy the hand-off's tarball and metadata into ``copy`` (root-only), refusing links and odd files."""
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir(mode=0o700, parents=True)  # what a compromised daemon names is never readable by it afterwards
    (copy / "metadata").mkdir()
    folder = _open_dir(handoff)
    try:
        _copy_regular(folder, TARBALL, copy / TARBALL, None, handoff)
        metadata = _open_at(folder, "metadata", os.O_DIRECTORY, handoff / "metadata")
        try:
            names = sorted(os.listdir(metadata))
            for name in names[:MAX_ROOTS + 4]:
                if name.endswith(".json") and not name.startswith("."):
                    _copy_regular(metadata, name, copy / "metadata" / name, MAX_METADATA_BYTES, handoff / "metadata")
        finally:
            os.close(metadata)
    finally:
        os.close(folder)


def remove_handoff(handoff: Path) -> None:
    """Remove the consumed hand-off without following a link on the way (the edged user owns ``ota/`` and
    everything in it): a link at ``release`` is removed itself, a link at ``ota`` is left alone with everything
    behind it, and the folder's contents are removed relative to their opened folders."""
    try:
        state = os.open(handoff.parent.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        ota = os.open(handoff.parent.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=state)
    except OSError:
        return  # gone, or a link: nothing behind it is edged-update's to remove
    finally:
        os.close(state)
    try:
        _remove_at(ota, handoff.name, MAX_REMOVE_DEPTH)
    finally:
        os.close(ota)


def _remove_at(folder: int, name: str, depth: int) -> None:
    try:
        if not stat.S_ISDIR(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode):
            os.unlink(name, dir_fd=folder)  # a file, or a link (removed, never followed)
            return
        if depth <= 0:
            return  # deeper than any hand-off: left for the daemon
        inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder)
    except OSError:
        return  # gone, or swapped for a link since: left alone
    try:
        for entry in os.listdir(inner):
            _remove_at(inner, entry, depth - 1)
    finally:
        os.close(inner)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=folder)


def _open_dir(handoff: Path) -> int:
    """The hand-off folder, reached from the state directory (root's to name) without following a link in
    ``ota/`` or ``release/``: every later open is relative to it, so nothing can be swapped in between."""
    state = os.open(handoff.parent.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ota = _open_at(state, handoff.parent.name, os.O_DIRECTORY, handoff.parent)
    finally:
        os.close(state)
    try:
        return _open_at(ota, handoff.name, os.O_DIRECTORY, handoff)
    finally:
        os.close(ota)


def _open_at(folder: int, name: str, flags: int, shown: Path) -> int:
    try:
        return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | flags, dir_fd=folder)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise UpdateRejected(f"{shown}: refused (a link or unreadable): {e}") from e


def _open_regular(folder: int, name: str, shown: Path) -> int:
    fd = _open_at(folder, name, 0, shown / name)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UpdateRejected(f"{shown / name}: not a regular file")
    return fd


def _read_regular(folder: int, name: str, shown: Path, limit: int) -> bytes:
    with os.fdopen(_open_regular(folder, name, shown), "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UpdateRejected(f"{shown / name}: larger than {limit} bytes")
    return data


def _copy_regular(folder: int, name: str, destination: Path, limit: int | None, shown: Path) -> None:
    source = shown / name
    with os.fdopen(_open_regular(folder, name, shown), "rb") as src, open(destination, "xb") as dst:
        copied = 0
        while chunk := src.read(CHUNK):
            copied += len(chunk)
            if limit is not None and copied > limit:
                raise UpdateRejected(f"{source}: larger than {limit} bytes")
            dst.write(chunk)
        dst.flush()
        os.fsync(dst.fileno())


class HandoffFetcher(FetcherInterface):
    """ngclient's network edge over the copied hand-off; ngclient still checks every byte it is given."""

    def __init__(self, copy: Path) -> None:
        self.copy = copy

    def _fetch(self, url: str) -> Iterator[bytes]:
        name = url.removeprefix(BASE)
        if name.startswith("targets/"):
            path = self.copy / TARBALL
        elif name == "metadata/timestamp.json":
            path = self.copy / "metadata" / "timestamp.json"
        elif name.endswith(".root.json"):
            path = self.copy / "metadata" / name.removeprefix("metadata/")
        elif name.endswith((".snapshot.json", ".targets.json")):
            path = self.copy / "metadata" / (name.rsplit(".", 2)[-2] + ".json")  # N.snapshot.json: the one dropped
        else:
            path = self.copy / "missing"
        if not path.is_file():
            raise exceptions.DownloadHTTPError(f"{name}: not in the hand-off", 404)
        return self._chunks(path)

    @staticmethod
    def _chunks(path: Path) -> Iterator[bytes]:
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk


def verify(copy: Path, trusted_root: Path, metadata_dir: Path, target: str, destination: Path) -> dict[str, Any]:
    """Verify ``target`` in the copied hand-off; the verified tarball is written to ``destination``. Returns
    the target's signed custom fields (kind, version, platform, ...)."""
    metadata_dir.mkdir(parents=True, exist_ok=True)
    if not (metadata_dir / "root.json").exists():
        if not trusted_root.is_file():
            raise UpdateRejected(f"no trusted root: {trusted_root} does not exist ([ota] root_file)")
        shutil.copyfile(trusted_root, metadata_dir / "root.json")
    problem = clock_problem(time.time(), metadata_dir / "root.json")
    if problem:
        raise UpdateRejected(problem)
    destination.parent.mkdir(parents=True, exist_ok=True)
    updater = Updater(str(metadata_dir), BASE + "metadata/", str(destination.parent), BASE + "targets/",
                      fetcher=HandoffFetcher(copy), bootstrap=None)
    with translated("verifying the hand-off"):
        updater.refresh()
        info: TargetFile | None = updater.get_targetinfo(target)
        if info is None:
            raise UpdateRejected(f"target {target} is not in the verified metadata")
        updater.download_target(info, str(destination))
    custom = dict(info.unrecognized_fields.get("custom", {}))
    if custom.get("kind") != "release":
        raise UpdateRejected(f"target {target}: kind {custom.get('kind')!r}, expected 'release'")
    if custom.get("platform") != PLATFORM:
        raise UpdateRejected(f"target {target}: built for {custom.get('platform')}, this device is {PLATFORM}")
    return {**custom, "sha256": info.hashes.get("sha256", "")}

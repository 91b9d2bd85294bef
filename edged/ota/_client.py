"""`TufClient`: python-tuf's ngclient over the resumable fetcher; the only place trust decisions are made.

ngclient decides (signatures, thresholds, versions, expiry, hashes, lengths); this module only translates its
exceptions at the boundary into `UpdateRejected` with a reason an operator can act on, and lists the verified
targets (read back from the metadata ngclient persisted only after verifying it).
"""

from __future__ import annotations

import errno
import time
from pathlib import Path
from typing import Any

from tuf.api import exceptions
from tuf.api._payload import TargetFile, Targets
from tuf.api.metadata import Metadata
from tuf.ngclient.updater import Updater

from edged.durable import write_atomic
from edged.errors import BadDownload, DiskFull, DownloadFailed, UpdateRejected
from edged.ota._fetcher import ResumableFetcher, SlowRetrieval

# A wall clock before this cannot be right (edged did not exist): expiry checks would be meaningless.
EARLIEST_SANE_WALL = 1_735_689_600.0  # 2025-01-01
# Nor can one this far past the trusted root's expiry: roots are re-signed yearly (edged.ota.fleet.EXPIRY), so
# a device whose clock reads years ahead would call every honest timestamp expired and refuse forever.
CLOCK_AHEAD_OF_ROOT_S = 365 * 86400.0


class TufClient:
    def __init__(self, repository_url: str, root_file: Path, cache_dir: Path, max_bytes_per_s: int, *,
                 min_bytes_per_s: int = 0, rate_window_s: float = 60.0) -> None:
        base = repository_url.rstrip("/")
        self.metadata_url = base + "/metadata/"
        self.targets_url = base + "/targets/"
        self.root_file = root_file
        self.metadata_dir = cache_dir / "metadata"
        self.target_dir = cache_dir / "targets"
        self.fetcher = ResumableFetcher(cache_dir / "partial", self.targets_url, max_bytes_per_s=max_bytes_per_s,
                                        min_bytes_per_s=min_bytes_per_s, rate_window_s=rate_window_s)
        self._updater: Updater | None = None

    def trusted_root(self) -> Path:
        cached = self.metadata_dir / "root.json"
        return cached if cached.exists() else self.root_file

    def refresh(self) -> dict[str, TargetFile]:
        trusted = self.metadata_dir / "root.json"
        with translated("preparing the metadata cache"):
            self.metadata_dir.mkdir(parents=True, exist_ok=True)
            self.target_dir.mkdir(parents=True, exist_ok=True)
            if not trusted.exists():
                if not self.root_file.is_file():
                    raise UpdateRejected(f"no trusted root: {self.root_file} does not exist ([ota] root_file)")
                write_atomic(trusted, self.root_file.read_bytes())  # a full disk must not leave half a root
        with translated("refreshing metadata"):  # the Updater writes (root) already: a full disk is "disk: ..."
            updater = Updater(str(self.metadata_dir), self.metadata_url, str(self.target_dir), self.targets_url,
                              fetcher=self.fetcher, bootstrap=None)
            updater.refresh()
        self._updater = updater
        targets = Metadata.from_file(str(self.metadata_dir / "targets.json")).signed
        if not isinstance(targets, Targets):
            raise UpdateRejected("targets.json: not a targets role")
        return dict(targets.targets)

    def download(self, name: str) -> tuple[Path, TargetFile]:
        if self._updater is None:
            raise RuntimeError("refresh() first")
        with translated(f"target {name}"):
            info = self._updater.get_targetinfo(name)
            if info is None:
                raise UpdateRejected(f"target {name} is no longer in the repository")
            path = self.target_dir / f"{info.hashes['sha256']}.tar"
            cached = self._updater.find_cached_target(info, str(path))
            downloaded = cached or self._updater.download_target(info, str(path))
        return Path(downloaded), info


def clock_problem(wall: float, trusted_root: Path) -> str:
    """Why the device clock cannot judge metadata expiry ("clock: ..."), or "" when it can."""
    day = time.strftime("%Y-%m-%d", time.gmtime(wall))
    if wall < EARLIEST_SANE_WALL:
        return f"clock: the device clock reads {day}, before this edged was built: every expiry check would " \
               "be wrong; set the clock (NTP or an RTC) and check again"
    try:
        expires = Metadata.from_file(str(trusted_root)).signed.expires.timestamp()
    except Exception:  # no or unreadable root: refresh() refuses it with its own reason
        return ""
    if wall > expires + CLOCK_AHEAD_OF_ROOT_S:
        return f"clock: the device clock reads {day}, more than a year past the trusted root's expiry " \
               f"({time.strftime('%Y-%m-%d', time.gmtime(expires))}): metadata would look expired; set the " \
               "clock (NTP or an RTC) and check again"
    return ""


class translated:
    """Turns ngclient's exceptions into `UpdateRejected` naming the attack or fault they stand for."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> None:
        if error is None or isinstance(error, UpdateRejected) or not isinstance(error, Exception):
            return
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            raise DiskFull(f"{self.what}: {reason_for(error)}") from error
        if isinstance(error, (exceptions.LengthOrHashMismatchError, exceptions.DownloadLengthMismatchError)):
            # the bytes that came are not the target: refuse them, not the target (see BadDownload)
            raise BadDownload(f"{self.what}: {reason_for(error)}; retried at the next check") from error
        if transient(error):
            raise DownloadFailed(f"{self.what}: {reason_for(error)}") from error
        raise UpdateRejected(f"{self.what}: {reason_for(error)}") from error


def transient(error: Exception) -> bool:
    """A fault of the way, not of the target: the network, a slow server (retried later)."""
    return isinstance(error, exceptions.DownloadError)


def reason_for(error: Exception) -> str:
    if isinstance(error, exceptions.ExpiredMetadataError):
        if time.time() < EARLIEST_SANE_WALL:
            return f"clock: the device clock reads {time.strftime('%Y-%m-%d', time.gmtime())}, metadata " \
                   f"looks expired ({error}); set the clock (NTP) and check again"
        now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        return f"expired metadata (a freeze attack, a repository not refreshed, or this device's clock running " \
               f"ahead (it reads {now}): set the clock (NTP or an RTC) if it is wrong): {error}"
    if isinstance(error, exceptions.BadVersionNumberError):
        return f"rollback: metadata older than the trusted copy: {error}"
    if isinstance(error, exceptions.UnsignedMetadataError):
        return f"signature: metadata not signed by the trusted keys: {error}"
    if isinstance(error, exceptions.DownloadLengthMismatchError):
        return f"endless data: more bytes than the metadata allows: {error}"
    if isinstance(error, exceptions.LengthOrHashMismatchError):
        return f"hash: content does not match its metadata (tampered or mix-and-match): {error}"
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return f"disk: no space left on the state directory ({error})"
    if isinstance(error, SlowRetrieval):
        return f"slow retrieval: {error}"
    if isinstance(error, exceptions.RepositoryError):
        return f"repository: {type(error).__name__}: {error}"
    if isinstance(error, exceptions.DownloadError):
        return f"network: {error}"
    return f"{type(error).__name__}: {error}"

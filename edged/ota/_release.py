"""Daemon releases on the device's unprivileged side: choose, download, verify, hand off, read the outcome.

The serving daemon never installs a release (it cannot: /opt is read-only to it). It downloads the target
through the same TUF client as models, then drops the verified tarball, the metadata it verified it with and a
``request.json`` into ``STATE_DIR/ota/release/`` in one directory rename, so the privileged ``edged-update``
(started by ``edged-update.path``) sees a complete hand-off or none. Nothing it drops is trusted there: edged-update
verifies it again against its own root. What edged-update did comes back in its root-owned outcome file
(``[ota] release_work_dir``/outcome.json), which the daemon serving afterwards (new or previous) reads into its
status. A release that was rolled back or refused is remembered by hash and never retried.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuf.api._payload import TargetFile
from tuf.api.metadata import Metadata

from edged.errors import BadDownload, DownloadFailed, UpdateRejected
from edged.ota._client import TufClient
from edged.ota._durable import fsync_dir, replace_dir, write_atomic
from edged.ota._policy import DeviceFacts, _version_tuple, skip_reason
from edged.ota._release_state import RELEASE_ALLOWED, ReleaseState, ReleaseStore, ReleaseUpdate

log = logging.getLogger(__name__)
PLATFORM = f"linux_{platform.machine()}"
REQUEST = "request.json"
TARBALL = "release.tar.gz"
MAX_OUTCOME_BYTES = 64 * 1024
MAX_ROOT_BYTES = 512 * 1024
# edged-update marks a hand-off "installing" as soon as it starts; one nobody took by then never will be
# (edged-update.path not enabled, an install from before release updates): refuse it so models update again.
HANDOFF_TIMEOUT_S = 900.0


class ReleaseUpdates:
    def __init__(self, client: TufClient, work_dir: Path, outcome_file: Path, device_id: str, facts: DeviceFacts,
                 on_change: Callable[[], None], machine: str = PLATFORM) -> None:
        self.client = client
        self.store = ReleaseStore(work_dir / "release-state.json")
        self.handoff = work_dir / "release"
        self.outcome_file = outcome_file
        self.device_id = device_id
        self.facts = facts
        self.on_change = on_change
        self.machine = machine
        self.skipped: dict[str, str] = {}

    @property
    def waiting(self) -> bool:
        """A release is with edged-update: model updates wait, the outcome file is polled."""
        current = self.store.current
        return current is not None and current.state in ("handed_off", "installing")

    def check(self, targets: dict[str, TargetFile]) -> bool:
        """Continue or start a release update; True while one is in progress (models wait for it)."""
        self.poll()
        current = self.store.current
        if current is not None and current.state == "downloading":
            if current.target in targets:
                self._deliver(current)
            else:
                self.store.move("refused", "the target is no longer in the repository")
        elif current is None or current.final:
            chosen = self._choose(targets)
            if chosen is not None:
                name, info = chosen
                custom = dict(info.unrecognized_fields.get("custom", {}))
                self.store.begin(ReleaseUpdate(name, info.hashes.get("sha256", ""), str(custom["version"]),
                                               self.facts.edged_version))
                self._deliver(self.store.move("downloading"))
        return self.store.current is not None and not self.store.current.final

    def _choose(self, targets: dict[str, TargetFile]) -> tuple[str, TargetFile] | None:
        self.skipped = {}
        best: tuple[str, TargetFile] | None = None
        for name, info in sorted(targets.items()):
            custom = dict(info.unrecognized_fields.get("custom", {}))
            if custom.get("kind") != "release":
                continue
            version, built_for = str(custom.get("version", "")), str(custom.get("platform", ""))
            digest = info.hashes.get("sha256", "")
            if built_for != self.machine:
                self.skipped[name] = f"incompatible: built for {built_for}, this device is {self.machine}"
            elif digest in self.store.bad:
                self.skipped[name] = f"known bad: {self.store.bad[digest]}"
            elif _version_tuple(version) <= _version_tuple(self.facts.edged_version):
                continue  # this release, or an older one
            elif reason := skip_reason(custom, self.device_id, self.facts):
                self.skipped[name] = reason
            elif best is None or _version_tuple(version) > _version_tuple(
                    str(best[1].unrecognized_fields["custom"]["version"])):
                best = name, info
        return best

    def _deliver(self, update: ReleaseUpdate) -> None:
        try:
            tarball, _ = self.client.download(update.target)  # ngclient checks its length and hash
            self._drop(update, tarball)
        except UpdateRejected as e:
            if isinstance(e, DownloadFailed):  # the way's fault (network, bytes not the target's): never marked bad
                if isinstance(e, BadDownload):  # bytes not worth resuming from
                    shutil.rmtree(self.client.fetcher.partial_dir, ignore_errors=True)
                log.warning("OTA: release %s: download interrupted, retried at the next check: %s", update.target, e)
                self.store.move("downloading", str(e))
                return
            log.error("OTA: release %s refused: %s", update.target, e)
            self.store.move("refused", str(e))
            return
        except OSError as e:
            self.store.move("downloading", f"cannot write the hand-off in {self.handoff}: {e}")
            return
        self.store.move("handed_off", "verified; waiting for edged-update (the privileged step) to install it")
        log.info("OTA: release %s handed off to edged-update", update.version)

    def _drop(self, update: ReleaseUpdate, tarball: Path) -> None:
        incoming = self.handoff.with_name("release.incoming")
        shutil.rmtree(incoming, ignore_errors=True)
        (incoming / "metadata").mkdir(parents=True)
        _copy_durably(tarball, incoming / TARBALL)
        for role in ("root", "timestamp", "snapshot", "targets"):
            _copy_durably(self.client.metadata_dir / f"{role}.json", incoming / "metadata" / f"{role}.json")
        # every root version after the first, so edged-update can walk its own (older) trusted root forward
        latest = Metadata.from_file(str(self.client.metadata_dir / "root.json")).signed.version
        for number in range(2, latest + 1):
            url = f"{self.client.metadata_url}{number}.root.json"
            try:
                raw = self.client.fetcher.download_bytes(url, MAX_ROOT_BYTES)
            except Exception as e:  # ngclient's DownloadError family and the network's: the hand-off waits
                raise DownloadFailed(f"network: fetching {url} for the hand-off: {e}") from e
            write_atomic(incoming / "metadata" / f"{number}.root.json", raw)
        request = {"target": update.target, "sha256": update.sha256, "version": update.version}
        write_atomic(incoming / REQUEST, json.dumps(request).encode())
        if self.handoff.exists():
            shutil.rmtree(self.handoff)
        replace_dir(incoming, self.handoff)

    def poll(self) -> None:
        """Take edged-update's outcome for the release handed off, when it names that release."""
        current = self.store.current
        if current is None or current.state not in ("handed_off", "installing"):
            return
        doc = read_outcome(self.outcome_file)
        if doc is None or doc.get("sha256") != current.sha256:
            if current.state == "handed_off" and time.time() - current.changed_at > HANDOFF_TIMEOUT_S:
                self.store.move("refused", f"edged-update did not take the hand-off within {HANDOFF_TIMEOUT_S:.0f} s:"
                                           " is edged-update.path enabled (systemctl enable --now edged-update.path)?")
                shutil.rmtree(self.handoff, ignore_errors=True)
                self.on_change()
            return
        state = doc.get("state")
        if state == current.state or state not in RELEASE_ALLOWED[current.state]:
            return
        reached: ReleaseState = state
        self.store.move(reached, str(doc.get("reason", "")))
        log.log(logging.INFO if reached in ("installing", "active") else logging.ERROR,
                "OTA: release %s: %s: %s", current.version, reached, current.reason)
        if current.final:
            shutil.rmtree(self.handoff, ignore_errors=True)
        self.on_change()

    def status(self) -> dict[str, Any]:
        current = self.store.current
        return {"state": current.state if current else "idle", "target": current.target if current else "",
                "version": current.version if current else "", "running": self.facts.edged_version,
                "previous_version": current.previous_version if current else "",
                "reason": current.reason if current else "", "changed_at": current.changed_at if current else None,
                "skipped": dict(self.skipped), "bad_releases": len(self.store.bad), "platform": self.machine}


def read_outcome(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read(MAX_OUTCOME_BYTES))
    except (OSError, ValueError):
        return None  # none yet, or being replaced: the next poll reads it
    return doc if isinstance(doc, dict) else None


def _copy_durably(source: Path, destination: Path) -> None:
    shutil.copyfile(source, destination)
    with open(destination, "rb") as f:
        os.fsync(f.fileno())
    fsync_dir(destination.parent)

"""`OtaAgent`: the device's update loop for models — check, download, stage, switch, watch, confirm or roll back.

One update at a time, each a persisted state machine (`_state`). Blocking work (network, loads, test vectors)
runs in a worker thread; `run` schedules checks every ``check_interval_s`` plus a random jitter so a fleet does
not hit its repository in one second. Metadata refused by TUF (wrong key, rollback, freeze, mix-and-match) is
reported in ``last_check`` and changes nothing; a target refused or rolled back is reported in ``update``, and
its hash is remembered as bad. The served versions are never touched before a new one passed its vectors.
"""

from __future__ import annotations

import asyncio
import logging
import random
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuf.api._payload import TargetFile

from edged.clock import Clock, DeviceClock
from edged.config import MACHINE_ID, DeviceIdentity, OtaConfig, resolve_device_identity
from edged.engine import InferenceService
from edged.errors import (
    BadDownload,
    ConfigKeyError,
    DiskFull,
    DownloadFailed,
    EdgedError,
    ModelConfigError,
    UpdateRejected,
)
from edged.ota._activate import Activator, check_disk, stage
from edged.ota._bundle import extract_bundle
from edged.ota._client import TufClient, clock_problem
from edged.ota._engine import build_staged_engine
from edged.ota._policy import DeviceFacts, device_facts, skip_reason
from edged.ota._release import ReleaseUpdates
from edged.ota._selftest import save_vectors, self_test
from edged.ota._state import TargetUpdate, UpdateStore, resume_action
from edged.ota._watch import health, verdict
from edged.repository import check_model_name, list_versions, parse_version

log = logging.getLogger(__name__)


def _model_and_version(custom: dict[str, Any]) -> tuple[str, int, str]:
    """The model folder and version a signed target names, or the reason they cannot be used on this device (a
    path segment of the repository, a version folder: never taken from metadata unchecked)."""
    model, raw = custom.get("model"), custom.get("version")
    if not isinstance(model, str):
        return "", 0, f"model {model!r}: expected a model name"
    try:
        check_model_name(model)
    except ModelConfigError as e:
        return "", 0, f"{e}"
    version = parse_version(str(raw)) if isinstance(raw, int) and not isinstance(raw, bool) else None
    if version is None:
        return "", 0, f"version {raw!r}: expected a whole number above 0 (a version folder)"
    return model, version, ""


class OtaAgent:
    def __init__(self, config: OtaConfig, service: InferenceService, repository: Path, state_dir: Path, *,
                 clock: Clock | None = None, facts: DeviceFacts | None = None,
                 identity: DeviceIdentity | None = None, machine_id: Path = MACHINE_ID) -> None:
        """``identity``: the daemon's one device id (shared with MQTT); alone, resolved from ``[ota]``."""
        if not config.repository_url:
            raise ConfigKeyError("ota.repository_url", "needed when [ota] enabled = true: set it to the TUF "
                                 "repository's base URL")
        self.config = config
        self.service = service
        self.repository = repository
        self.work_dir = state_dir / "ota"
        self.identity = identity or resolve_device_identity(None, config.device_id, machine_id)
        self.facts = facts or device_facts()
        self.clock: Clock = clock or DeviceClock()
        if 0 < config.max_bytes_per_s < config.min_bytes_per_s:
            raise ConfigKeyError("ota.min_bytes_per_s", f"{config.min_bytes_per_s} is above max_bytes_per_s "
                                 f"{config.max_bytes_per_s}: every download would be given up as too slow")
        self.client = TufClient(config.repository_url, Path(config.root_file), self.work_dir, config.max_bytes_per_s,
                                min_bytes_per_s=config.min_bytes_per_s, rate_window_s=config.rate_window_s)
        self.store = UpdateStore(self.work_dir / "state.json", self._changed)
        self.listeners: list[Callable[[dict[str, Any]], None]] = []  # told each status change (MQTT)
        self.activator = Activator(service, repository, self.work_dir / "backup")
        self.release = ReleaseUpdates(self.client, self.work_dir, Path(config.release_work_dir) / "outcome.json",
                                      self.identity.device_id, self.facts, self._changed)
        self.skipped: dict[str, str] = {}
        self.last_check: dict[str, Any] = {}
        self._watch: tuple[float, float | None] | None = None  # (elapsed at switch, baseline p99)
        # one check, rollback or watch verdict at a time; reentrant: a check that installs judges the watch at once
        self._lock = threading.RLock()
        self._nudged = threading.Event()

    def stop(self) -> None:
        """The daemon stops: a download ends at its next chunk and nothing further is staged or switched; the
        update keeps its state and resumes at the next start (never refused or remembered bad for the stop)."""
        self.client.fetcher.stopping.set()

    @property
    def stopping(self) -> bool:
        return self.client.fetcher.stopping.is_set()

    def nudge(self) -> None:
        """Ask for a check soon (the MQTT topic ``ota/check``); never blocks the caller's thread."""
        self._nudged.set()

    def _changed(self) -> None:
        doc = self.status()
        for listener in self.listeners:
            try:
                listener(doc)
            except Exception:  # a broken listener must not stop an update half way
                log.exception("OTA status listener failed")

    # --- start-up ------------------------------------------------------------------------------------------
    def recover_files(self) -> None:
        """Before the engine starts: an update interrupted after its switch leaves the repository again, so the
        version that was never confirmed does not serve for a moment at start-up. `resume` records the rest.
        edged-update's outcome is read here too, before the daemon is ready: a release it rolled back to (or
        installed) never reports the update as still installing."""
        self.release.poll()
        current = self.store.current
        if current is not None and resume_action(current) == "roll_back":
            self.activator.roll_back_files(current.model, current.version)

    def resume(self) -> None:
        """After a restart: bring back OTA-installed models, then finish or undo an interrupted update."""
        self.release.poll()  # a release handed off before this start: edged-update may have finished it
        for model in sorted(self.store.installed):
            if (self.repository / model).is_dir() and model not in self.service.model_names():
                try:
                    self.service.reload_model(model)
                except EdgedError as e:
                    log.error("OTA model %s did not load after restart: %s", model, e)
        current = self.store.current
        if current is None or current.final:
            self._changed()  # the retained status starts with what is on disk
            return
        action = resume_action(current)
        log.warning("OTA: update %s was interrupted in state %s: %s", current.target, current.state, action)
        if action == "roll_back":
            self._roll_back(f"interrupted while {current.state}: rolled back at restart")
        else:
            self.check()

    # --- checks --------------------------------------------------------------------------------------------
    def check(self) -> dict[str, Any]:
        with self._lock:
            started = time.time()
            try:
                clock = clock_problem(self.clock.wall(), self.client.trusted_root())
                if clock:  # ngclient would judge expiry by this clock: refuse before it does
                    raise UpdateRejected(clock)
                targets = self.client.refresh()
            except UpdateRejected as e:
                self.last_check = {"at": started, "outcome": "refused", "reason": str(e)}
                log.error("OTA check refused: %s", e)
                self._changed()
                return self.status()
            self.last_check = {"at": started, "outcome": "ok", "reason": ""}
            model_busy = self.store.current is not None and not self.store.current.final
            # a daemon release first (models wait while it installs), but never in the middle of a model update
            releasing = not model_busy and self.release.check(targets)
            chosen = None if releasing else self._choose(targets)
            if chosen is not None:
                self._update(*chosen)
            self._changed()
            return self.status()

    def _choose(self, targets: dict[str, TargetFile]) -> tuple[str, TargetFile] | None:
        current = self.store.current
        if current is not None and current.state == "watching":
            return None  # installed and under watch: nothing is due until the window decides (evaluate_watch)
        if current is not None and not current.final and current.target in targets:
            return current.target, targets[current.target]  # an interrupted update continues
        self.skipped = {}
        for name, info in sorted(targets.items()):
            custom = dict(info.unrecognized_fields.get("custom", {}))
            if custom.get("kind") == "release":
                continue  # daemon releases: edged.ota._release
            if custom.get("kind") != "model":
                self.skipped[name] = f"kind {custom.get('kind')!r} is not handled by this edged (models only)"
                continue
            digest = info.hashes.get("sha256", "")
            if digest in self.store.bad:
                self.skipped[name] = f"known bad: {self.store.bad[digest]}"
                continue
            model, version, problem = _model_and_version(custom)
            if problem:
                self.skipped[name] = problem
                continue
            served = self._versions(model)
            if served and version <= max(served):
                continue  # installed already, or older than what is served
            reason = skip_reason(custom, self.identity.device_id, self.facts)
            if reason:
                self.skipped[name] = reason
                continue
            return name, info
        return None

    def _versions(self, model: str) -> list[int]:
        folder = self.repository / model
        return list_versions(folder) if folder.is_dir() else []

    # --- one update ----------------------------------------------------------------------------------------
    def _update(self, name: str, info: TargetFile) -> None:
        custom = dict(info.unrecognized_fields.get("custom", {}))
        model, version = str(custom["model"]), int(custom["version"])
        current = self.store.current
        if current is None or current.final or current.target != name:
            served = self._versions(model)
            self.store.begin(TargetUpdate(name, info.hashes.get("sha256", ""), model, version,
                                          max(served) if served else None))
        try:
            check_disk(self.work_dir, info.length, self._bytes_on_disk(info))
            self._download_and_stage(name, model, version)
        except UpdateRejected as e:
            if self.stopping:  # a download cut or a load refused for the stop: this update goes on at the next start
                log.info("OTA: update %s left %s for the stop: %s", name, self.store.current.state
                         if self.store.current else "idle", e)
                return
            if isinstance(e, DownloadFailed):  # the way failed, not the target: retried at the next check
                if isinstance(e, (DiskFull, BadDownload)):  # no space, or bytes not worth resuming from
                    shutil.rmtree(self.client.fetcher.partial_dir, ignore_errors=True)
                self._refuse(str(e), remember=False)
            else:
                self._refuse(str(e))
            return
        if self.stopping:
            log.info("OTA: update %s staged, switched at the next start (the daemon is stopping)", name)
            return
        self._switch(model, version)

    def _bundle_path(self, sha256: str) -> Path:
        return self.client.target_dir / f"{sha256}.tar"

    def _bytes_on_disk(self, info: TargetFile) -> int:
        """What an interrupted attempt already stored of this target (a partial or the whole bundle)."""
        stored = [self._bundle_path(info.hashes.get("sha256", ""))]
        if self.client.fetcher.partial_dir.is_dir():
            stored += list(self.client.fetcher.partial_dir.iterdir())
        return sum(p.stat().st_size for p in stored if p.is_file())

    def _download_and_stage(self, name: str, model: str, version: int) -> None:
        update = self.store.current
        if update is None:
            raise RuntimeError("no update")
        if update.state in ("idle", "downloading"):
            self.store.move("downloading")
            bundle, _ = self.client.download(name)
            self.store.move("verified")
        else:
            bundle, _ = self.client.download(name)  # cached: verified against its hash again
        staging = self.work_dir / "staging"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        vectors = extract_bundle(bundle, model, version, staging)
        build_staged_engine(staging / model, model, version)  # a TensorRT engine is built here, before the vectors
        save_vectors(self.work_dir, model, version, vectors)  # the self-test of a later daemon release uses them
        if update.state == "verified":
            self.store.move("staged")
        stage(self.service, staging / model, model, version, vectors)

    def _switch(self, model: str, version: int) -> None:
        previous = self.store.current.previous_version if self.store.current else None
        baseline = None
        if previous is not None:
            try:
                baseline = health(self.service.version_info(model, str(previous))).p99_s
            except EdgedError:
                baseline = None
        self.activator.prepare(model)
        self.store.move("activating")
        try:
            self.activator.switch(self.work_dir / "staging" / model, model, version)
        except (EdgedError, OSError) as e:
            self._roll_back(f"the switch failed: {e}")
            return
        self.store.move("watching", f"watching for {self.config.watch_s:g} s")
        self._watch = (self.clock.elapsed(), baseline)
        self.evaluate_watch()

    def evaluate_watch(self) -> str:
        """Judge the watch window now: "wait", "pass" (now active) or "fail" (now rolled back). Under the agent's
        lock: the periodic verdict runs in an executor thread, and without it an operator's rollback or a check
        at the same moment could interleave with it (a rollback recorded over a confirmation, or the reverse)."""
        with self._lock:
            return self._evaluate_watch()

    def _evaluate_watch(self) -> str:
        update = self.store.current
        if update is None or update.state != "watching" or self._watch is None:
            return "none"
        began, baseline = self._watch
        try:
            new = health(self.service.version_info(update.model, str(update.version)))
        except EdgedError as e:
            self._roll_back(f"the new version is not served: {e}")
            return "fail"
        over = self.clock.elapsed() - began >= self.config.watch_s
        outcome, reason = verdict(new, baseline, max_error_rate=self.config.max_error_rate,
                                  max_p99_ratio=self.config.max_p99_ratio, min_requests=self.config.min_requests,
                                  window_over=over)
        if outcome == "fail":
            self._roll_back(reason)
        elif outcome == "pass":
            self._confirm(update, reason)
        return outcome

    def _confirm(self, update: TargetUpdate, reason: str) -> None:
        update.installed_before = self.store.installed.get(update.model)  # saved with the move below
        self.store.installed[update.model] = update.version
        self.store.move("active", reason)
        self._watch = None
        removed = self.activator.prune(update.model, self.config.keep_versions)
        if removed:
            log.info("OTA: model %s: removed old versions %s (keep_versions %d)", update.model, removed,
                     self.config.keep_versions)
        self._drop_files(update)

    def _drop_files(self, update: TargetUpdate) -> None:
        """At a final state: the staging copy and the cached bundle are not needed again (a rollback uses the
        previous version on disk), and the state directory's space is shared."""
        shutil.rmtree(self.work_dir / "staging", ignore_errors=True)
        self._bundle_path(update.sha256).unlink(missing_ok=True)

    def _refuse(self, reason: str, remember: bool = True) -> None:
        update = self.store.current
        if update is None:
            return
        log.error("OTA: target %s refused: %s", update.target, reason)
        if remember:
            self.store.bad[update.sha256] = reason
        self.store.move("refused", reason)
        self._drop_files(update)

    def _roll_back(self, reason: str) -> None:
        update = self.store.current
        if update is None:
            return
        log.error("OTA: rolling back %s version %d: %s", update.model, update.version, reason)
        self.activator.roll_back(update.model, update.version)
        if update.state == "active":  # confirmed before: the model is back to what OTA had installed, if anything
            if update.installed_before is None:
                self.store.installed.pop(update.model, None)
            else:
                self.store.installed[update.model] = update.installed_before
        self.store.bad[update.sha256] = reason
        self.store.move("rolled_back", reason)
        self._watch = None
        self._drop_files(update)

    def rollback(self) -> dict[str, Any]:
        """The operator's rollback of the update watching or active now."""
        with self._lock:
            update = self.store.current
            if update is None or update.state not in ("watching", "active"):
                state = update.state if update else "none"
                raise UpdateRejected(f"nothing to roll back: the last update is {state}")
            self._roll_back("rolled back by the operator")
            return self.status()

    # --- reporting and scheduling --------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        update = self.store.current
        return {
            "enabled": True, "device_id": self.identity.device_id, "device_id_source": self.identity.source,
            "device": {"module": self.facts.module, "jetpack": self.facts.jetpack, "l4t": self.facts.l4t,
                       "tensorrt": self.facts.tensorrt, "edged": self.facts.edged_version},
            "repository_url": self.config.repository_url,
            "state": update.state if update else "idle", "target": update.target if update else "",
            "model": update.model if update else "", "version": update.version if update else None,
            "previous_version": update.previous_version if update else None,
            "reason": update.reason if update else "", "changed_at": update.changed_at if update else None,
            "download": self.client.fetcher.progress.as_json(), "skipped": dict(self.skipped),
            "last_check": dict(self.last_check), "bad_targets": len(self.store.bad),
            "installed": dict(self.store.installed), "release": self.release.status(),
        }

    def self_test(self) -> dict[str, Any]:
        """Every served model answers (test vectors, else warm-up): what edged-update waits for."""
        return self_test(self.service, self.work_dir)

    def history(self) -> dict[str, Any]:
        return {"history": list(self.store.history), "bad": dict(self.store.bad)}

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.resume)
        delay = random.uniform(0, self.config.jitter_s)  # the first check soon after start, spread by jitter
        while True:
            deadline = loop.time() + delay
            delay = self.config.check_interval_s + random.uniform(0, self.config.jitter_s)
            self._nudged.clear()
            while loop.time() < deadline and not self._nudged.is_set():
                await asyncio.sleep(min(0.2, max(0.0, deadline - loop.time())))
                if self._watch is not None:
                    await loop.run_in_executor(None, self.evaluate_watch)
                if self.release.waiting:
                    await loop.run_in_executor(None, self.release.poll)
            await loop.run_in_executor(None, self.check)

"""``edged-update``: the privileged step of a daemon release update, run as root by ``edged-update.service``.

The serving daemon stays unprivileged with /opt read-only; it only verifies a release and drops it in
``STATE_DIR/ota/release/`` (`edged.ota._release`). ``edged-update.path`` starts this oneshot when that hand-off
appears, and the service also runs at boot to finish an update a power loss interrupted. In order:

1. take: copy the hand-off into the root-owned work folder (``[ota] release_work_dir``), no links followed;
2. verify: python-tuf again, against edged-update's own trusted root and metadata cache (`_release_verify`);
3. install: the verified tarball's ``install.sh --no-restart`` builds ``/opt/edged/releases/<v>``, switches
   ``current`` and installs that release's units; the previous release serves meanwhile;
4. restart: stop edged, back up the telemetry and outbox databases (`_release_data`), start the new release;
5. check: within ``[ota] release_health_s`` the new daemon must answer as the new version, be READY and pass
   its self-test (``POST /v2/edged/ota/selftest``: every served model answers), and it must still be that same
   process, READY, when ``release_health_s`` ends (one that crashes after its self-test is rolled back);
6. otherwise roll back: stop, ``install.sh --rollback --no-restart``, restore the databases it migrated, remove
   the failed release, start the previous one.

Every step is journaled (``journal.json`` in the work folder) before it runs: a kill -9 or a power loss before
the install starts over from the hand-off (verification included); one during or after it rolls back. The
outcome (installing, active, rolled_back or refused, with the reason) is written to ``outcome.json`` there,
readable by the daemon, which reports it in its status, /metrics and retained MQTT OTA status.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edged.client import ClientError, EdgedClient
from edged.config import load_config
from edged.errors import EdgedError, UpdateRejected
from edged.ota._durable import write_atomic
from edged.ota._release_data import back_up, restore_migrated
from edged.ota._release_verify import read_request, remove_handoff, take, verify
from edged.ota._service import SYSTEMCTL, CommandManager, ServiceManager

log = logging.getLogger("edged.ota.release_apply")
POLL_S = 0.5
# Interrupted in one of these, the new release may be current or running: roll back. Before them (taken,
# verified) nothing was changed yet: start over from the hand-off.
ROLL_BACK_STATES = frozenset({"installing", "installed", "started", "checking", "rolling_back"})


@dataclass(frozen=True)
class Settings:
    handoff: Path  # STATE_DIR/ota/release: written by edged, read only through _release_verify
    work_dir: Path  # root-owned: copies, metadata cache, backups, journal, outcome
    trusted_root: Path
    socket: str
    health_s: float
    databases: tuple[Path, ...]
    root: str  # install.sh --root ("" on a device)

    @property
    def opt(self) -> Path:
        return Path(self.root or "/") / "opt" / "edged"


def settings_from(config_file: str, root: str) -> Settings:
    from edged.mqtt.frontend import OUTBOX_FILE
    from edged.telemetry import default_database_path

    config = load_config(config_file)
    state_dir = Path(config.state_dir or "/var/lib/edged")  # the unit's StateDirectory=
    telemetry = Path(default_database_path(str(state_dir), config.telemetry.database))
    return Settings(state_dir / "ota" / "release", Path(config.ota.release_work_dir), Path(config.ota.root_file),
                    config.server.socket or "/run/edged/edged.sock", config.ota.release_health_s,
                    (telemetry, state_dir / OUTBOX_FILE), root)


class ReleaseApplier:
    def __init__(self, settings: Settings, manager: ServiceManager,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.s = settings
        self.manager = manager
        self.monotonic = monotonic
        self.journal_file = settings.work_dir / "journal.json"

    # --- the journal and the outcome -----------------------------------------------------------------------
    def _journal(self, doc: dict[str, Any], state: str) -> dict[str, Any]:
        doc = {**doc, "state": state, "at": time.time()}
        write_atomic(self.journal_file, json.dumps(doc, sort_keys=True).encode())
        return doc

    def _outcome(self, doc: dict[str, Any], state: str, reason: str, *, logged: bool = True) -> str:
        outcome = {k: doc.get(k, "") for k in ("target", "sha256", "version", "previous")}
        write_atomic(self.s.work_dir / "outcome.json",
                     json.dumps({**outcome, "state": state, "reason": reason, "at": time.time()}).encode())
        if logged:
            (log.info if state in ("installing", "active") else log.error)("release %s: %s: %s", doc.get("version"),
                                                                           state, reason)
        return state

    def _finish(self, doc: dict[str, Any], state: str, reason: str) -> str:
        self._outcome(doc, state, reason)
        remove_handoff(self.s.handoff)  # consumed: the .path unit must not start us again; no link followed
        for name in ("incoming", "unpacked"):
            shutil.rmtree(self.s.work_dir / name, ignore_errors=True)
        self.journal_file.unlink(missing_ok=True)
        return state

    # --- the run -------------------------------------------------------------------------------------------
    def run(self) -> str:
        """One pass: finish an interrupted update, or apply the hand-off; returns the outcome's state."""
        self.s.work_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        if self.journal_file.exists():
            doc = json.loads(self.journal_file.read_text(encoding="utf-8"))
            if doc.get("state") in ROLL_BACK_STATES:
                return self._roll_back(doc, f"edged-update was interrupted while {doc['state']}: rolled back")
        try:
            request = read_request(self.s.handoff)
        except UpdateRejected as e:
            return self._finish({}, "refused", str(e))
        if request is None:
            log.info("no release hand-off in %s: nothing to do", self.s.handoff)
            return "none"
        doc = self._journal(request, "taken")
        self._outcome(doc, "installing", f"installing edged {request['version']}")
        try:
            tarball, version = self._take_and_verify(doc)
            doc = self._install(doc, tarball, version)
        except (UpdateRejected, OSError) as e:
            journaled = json.loads(self.journal_file.read_text(encoding="utf-8"))
            if journaled.get("state") in ROLL_BACK_STATES:
                return self._roll_back(journaled, f"the install failed: {e}")
            return self._finish(doc, "refused", str(e))
        return self._restart_and_check(doc)

    def _take_and_verify(self, doc: dict[str, Any]) -> tuple[Path, str]:
        copy = self.s.work_dir / "incoming"
        take(self.s.handoff, copy)
        tarball = self.s.work_dir / "releases" / f"{doc['sha256']}.tar.gz"
        custom = verify(copy, self.s.trusted_root, self.s.work_dir / "metadata", doc["target"], tarball)
        if custom["sha256"] != doc["sha256"] or str(custom.get("version")) != doc["version"]:
            raise UpdateRejected(f"the hand-off names {doc['version']} ({doc['sha256'][:12]}), the verified "
                                 f"metadata {custom.get('version')} ({custom['sha256'][:12]})")
        self._journal(doc, "verified")
        return tarball, str(custom["version"])

    def _install(self, doc: dict[str, Any], tarball: Path, version: str) -> dict[str, Any]:
        unpacked = self.s.work_dir / "unpacked"
        shutil.rmtree(unpacked, ignore_errors=True)
        try:
            with tarfile.open(tarball, "r:gz") as tar:
                tar.extractall(unpacked, filter="data")
        except (tarfile.TarError, OSError) as e:
            raise UpdateRejected(f"the verified tarball does not unpack: {e}") from e
        top = unpacked / f"edged-{version}"
        manifest = json.loads((top / "manifest.json").read_text(encoding="utf-8"))
        if manifest.get("version") != version:
            raise UpdateRejected(f"the tarball's manifest says {manifest.get('version')}, its target {version}")
        doc = self._journal({**doc, "previous": self._current()}, "installing")
        result = self._script(top / "install.sh")
        doc = self._journal(doc, "installed")  # from here on, an interruption rolls back
        if result.returncode != 0:
            output = (result.stdout + result.stderr).strip()
            raise UpdateRejected(f"install.sh failed ({result.returncode}): {output[-600:]}")
        if self._current() != f"releases/{version}":
            raise UpdateRejected(f"install.sh did not make {version} current (current: {self._current()})")
        return doc

    def _script(self, script: Path, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [str(script), *args, "--no-restart", *(["--root", self.s.root] if self.s.root else [])]
        # only the caller's PATH (systemd's clean one on a device): a PYTHONPATH would shadow the release being
        # installed; and no package index
        env = {"PATH": os.environ.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
               "LANG": "C.UTF-8", "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": "/dev/null"}
        return subprocess.run(argv, capture_output=True, text=True, timeout=3600, check=False, env=env)

    def _current(self) -> str:
        link = self.s.opt / "current"
        try:
            return "releases/" + Path(os.readlink(link)).name
        except OSError:
            return ""

    def _restart_and_check(self, doc: dict[str, Any]) -> str:
        try:
            self.manager.stop()
            doc = self._journal({**doc, "databases": back_up(list(self.s.databases), self.s.work_dir / "backup")},
                                "started")
            # release_health_s counts from the start: `systemctl start` itself waits for READY (models load)
            deadline = self.monotonic() + self.s.health_s
            self.manager.start(self.s.health_s)
        except UpdateRejected as e:
            return self._roll_back(doc, f"starting the new release failed: {e}")
        doc = self._journal(doc, "checking")
        problem = self._wait_healthy(doc["version"], deadline)
        if problem:
            return self._roll_back(doc, f"edged {doc['version']} {problem} within [ota] release_health_s "
                                        f"{self.s.health_s:g} s: rolled back to {doc['previous'] or 'none'}")
        return self._finish(doc, "active", f"edged {doc['version']} is READY and passed its self-test")

    def _wait_healthy(self, version: str, deadline: float) -> str:
        """"" when the new daemon answers as ``version``, READY, self-test passed, and is still that same process,
        READY, at ``deadline`` (a release that crashes after its self-test would otherwise be kept and restarted
        by systemd in a loop for good); else what it failed."""
        problem = "did not answer on its socket"
        pid = None
        while pid is None:
            problem, pid = _probe(self.s.socket, version)
            if pid is not None:
                break
            if self.monotonic() >= deadline:
                return problem
            time.sleep(POLL_S)
        while self.monotonic() < deadline:
            time.sleep(min(POLL_S, max(0.0, deadline - self.monotonic())))
            problem = _still_serving(self.s.socket, pid)
            if problem:
                return f"became READY and passed its self-test, then {problem}"
        return ""

    def _roll_back(self, doc: dict[str, Any], reason: str) -> str:
        doc = self._journal(doc, "rolling_back")
        notes = []
        try:
            self.manager.stop()
        except UpdateRejected as e:
            notes.append(str(e))
        if self._current() == f"releases/{doc.get('version')}" and doc.get("previous"):
            result = self._script(self.s.opt / doc["previous"] / "share" / "edged" / "install.sh", "--rollback")
            if result.returncode != 0:
                notes.append(f"install.sh --rollback failed: {(result.stdout + result.stderr).strip()[-400:]}")
            elif doc.get("version"):
                shutil.rmtree(self.s.opt / "releases" / str(doc["version"]), ignore_errors=True)  # never again
        try:
            restored = restore_migrated(list(self.s.databases), self.s.work_dir / "backup", doc.get("databases", {}))
            if restored:
                notes.append(f"restored the databases it migrated: {', '.join(restored)}")
        except UpdateRejected as e:  # the previous release starts all the same: a device must serve
            notes.append(str(e))
        try:
            # the outcome before the start: the previous release reads it as it starts, so it never reports
            # the update as still installing (a kill -9 from here on finds the journal and rolls back again)
            self._outcome(doc, "rolled_back", "; ".join([reason, *notes]), logged=False)
            self.manager.start(self.s.health_s)  # the previous release loads the same models
        except UpdateRejected as e:
            notes.append(str(e))
        return self._finish(doc, "rolled_back", "; ".join([reason, *notes]))


def _probe(socket: str, version: str) -> tuple[str, int | None]:
    """("", the daemon's PID) once it answers as ``version``, READY, self-test passed; else (what failed, None)."""
    try:
        with EdgedClient(socket, timeout_s=30) as client:
            status = client.status()
            if status.get("version") != version:
                return f"still answered as {status.get('version')}, not {version},", None
            if not status.get("ready"):
                return "did not become READY", None
            report = client.ota("selftest")
    except (ClientError, EdgedError, OSError) as e:
        return f"did not answer on its socket ({e})", None
    if not report.get("ok"):
        failed = {k: v for k, v in dict(report.get("models", {})).items() if not str(v).startswith("ok")}
        return f"failed its self-test ({json.dumps(failed, sort_keys=True)[:400]})", None
    return "", int(status.get("pid") or 0)


def _still_serving(socket: str, pid: int) -> str:
    """"" while the daemon that passed its self-test (``pid``) answers and is READY; else what changed."""
    try:
        with EdgedClient(socket, timeout_s=30) as client:
            status = client.status()
    except (ClientError, EdgedError, OSError) as e:
        return f"did not answer on its socket ({e})"
    if pid and int(status.get("pid") or 0) != pid:  # (a status without its pid is judged by READY alone)
        return f"restarted (PID {pid}, then {status.get('pid')})"
    if not status.get("ready"):
        return "was no longer READY"
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edged-update", description="Install a daemon release that edged "
                                     "verified and handed off; check it; roll it back when it fails. Run as root.")
    parser.add_argument("--config", default="/etc/edged/edged.toml", help="edged's config (default: %(default)s)")
    parser.add_argument("--root", default="", help="install under this root (images, tests); default /")
    parser.add_argument("--service-command", default=SYSTEMCTL,
                        help="how to stop and start edged; {action} is stop or start (default: %(default)r)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="edged-update: %(message)s")
    try:
        state = ReleaseApplier(settings_from(args.config, args.root), CommandManager(args.service_command)).run()
    except EdgedError as e:
        print(f"edged-update: error: {e}", file=sys.stderr)
        return 1
    print(f"edged-update: {state}")
    return 0 if state in ("none", "active") else 2


if __name__ == "__main__":
    sys.exit(main())

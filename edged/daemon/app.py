"""`Daemon`: builds the parts in order, runs them on one asyncio loop, and stops them in reverse.

Start-up order: listeners open first (so a socket-activated connection waits instead of failing and
``/v2/health/live`` answers during loading), then the models load in a thread while systemd's start timeout is
extended, then MQTT and telemetry start, and only then READY=1. Stop order is the reverse; SIGHUP rescans the
repository and re-reads what can change without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from edged import __version__
from edged.access import GRPC_NAME, Activated, activated_sockets
from edged.clock import DeviceClock, state_file_in
from edged.config import EdgedConfig, load_config, resolve_device_identity, resolve_state_dir
from edged.daemon._health import (
    health_status,
    render_health,
    render_stalls,
    stall_reason,
    stalled_runs,
    supervised_task,
)
from edged.daemon._lock import lock_state_dir
from edged.daemon._restarts import StartHistory
from edged.daemon._sdnotify import SystemdNotifier
from edged.daemon._stop import StopBudget
from edged.daemon.paths import bundled_models
from edged.engine import InferenceService
from edged.engine.memory_governor import MemoryGovernor
from edged.errors import ConfigError, EdgedError
from edged.exposition import MetricFamily, render
from edged.memory import PressureMonitor, active_allocator
from edged.serving import HttpServer
from edged.serving.listeners import Listener, default_socket_path, open_listeners
from edged.shm import SharedMemoryRegistry, ShmLimits
from edged.supervision import HealthBoard
from edged.telemetry import TelemetryService, default_database_path, summary_payload

if TYPE_CHECKING:
    from edged.ota import OtaAgent

log = logging.getLogger(__name__)

EXTEND_TIMEOUT_EVERY_S = 5.0
CLOCK_CHECKPOINT_EVERY_S = 60.0  # what a power cut may take from device elapsed time (rows push it on anyway)
ENGINE_CHECK_EVERY_S = 1.0  # how often the health board looks for runs past [models] stall_timeout_s


class Daemon:
    def __init__(self, config: EdgedConfig, environ: Mapping[str, str] | None = None,
                 loaded: EdgedConfig | None = None) -> None:
        self.config = config
        # the file as first read, before command-line flags: what SIGHUP's re-read is compared with
        self._loaded = loaded if loaded is not None else config
        self.environ = dict(os.environ if environ is None else environ)
        self.started_at = time.time()
        self.state_dir = resolve_state_dir(config.state_dir, self.environ)
        if self.state_dir.exists() and not self.state_dir.is_dir():  # before anything under it is opened
            raise _state_dir_error(self.state_dir, "it exists and is not a directory")
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _state_dir_error(self.state_dir, e.strerror or str(e)) from e
        _check_state_dir_owner(self.state_dir)
        # Before any part opens a file under it (the clock, the outbox, telemetry, OTA): a second daemon on this
        # directory stops here, having touched nothing. Held until the process ends.
        self._state_lock = lock_state_dir(self.state_dir)
        self.repository = _repository(config, self.state_dir)
        self.socket_path = Path(config.server.socket) if config.server.socket else default_socket_path(self.environ)
        self.notifier = SystemdNotifier.from_environ(self.environ)
        pressure = PressureMonitor.from_config(config.memory, on_change=self._pressure_changed)
        self.memory = MemoryGovernor(config.memory, pressure)
        self.service = InferenceService(self.repository, config.models, max_elements=config.server.max_tensor_elements,
                                        memory=self.memory, unload_timeout_s=config.server.shutdown_timeout_s)
        self.health = HealthBoard()  # the supervised background threads; readiness stays about inference
        # Read once: malloc cannot change in a running process, and status must answer even when no file
        # descriptor is left to read /proc/self/maps with.
        self.allocator = active_allocator()
        self._memory_last: dict[str, Any] = {"budget_bytes": None, "under_pressure": False}
        # One clock per state directory: telemetry and the outbox age their rows by its elapsed time.
        self.clock = DeviceClock(state_file_in(self.state_dir))
        self.telemetry: TelemetryService | None = None
        if config.telemetry.source != "off":
            database = default_database_path(str(self.state_dir), config.telemetry.database)
            self.telemetry = TelemetryService(config.telemetry, database, activity=self.service, health=self.health,
                                              clock=self.clock)
            telemetry = self.telemetry
            self.service.generation.energy_per_unit_mj = lambda: telemetry.snapshot()["energy_per_inference_mj"]
        # one id for the MQTT topics, the OTA status topic and the rollout bucket (a ConfigError when the two
        # sections name different ones)
        self.identity = resolve_device_identity(config.mqtt.device_id, config.ota.device_id)
        self.ota: OtaAgent | None = None
        if config.ota.enabled:
            from edged.ota import OtaAgent  # only when enabled: python-tuf is the optional "ota" extra

            self.repository.mkdir(parents=True, exist_ok=True)
            self.ota = OtaAgent(config.ota, self.service, self.repository, self.state_dir, identity=self.identity)
        self.mqtt: Any = None
        if config.mqtt.broker:
            from edged.mqtt import MqttFrontEnd  # only when configured: paho and threads cost memory
            from edged.serving.chat_codec import OpenAIChatCodec

            commands = {"ota/check": self.ota.nudge} if self.ota is not None else {}
            mqtt_config = dataclasses.replace(config.mqtt, device_id=self.identity.device_id)
            # {prefix}/chat speaks the same OpenAI JSON as /v1/chat/completions: the HTTP side owns those shapes
            self.mqtt = MqttFrontEnd(self.service, mqtt_config, self.state_dir, version=__version__,
                                     health=self.health, clock=self.clock, commands=commands,
                                     chat=OpenAIChatCodec())
            if self.ota is not None:
                mqtt = self.mqtt
                self.ota.listeners.append(lambda doc: mqtt.publish_state("ota/status", orjson.dumps(doc)))
        ota = self.ota
        actions = {"ota/status": ota.status, "ota/history": ota.history, "ota/check": ota.check,
                   "ota/rollback": ota.rollback, "ota/selftest": ota.self_test} if ota is not None else {}
        # one registry for both front ends: a region registered over HTTP is usable over gRPC and vice versa
        self.shared_memory = SharedMemoryRegistry(ShmLimits(config.server.shm_max_regions,
                                                            config.server.shm_max_bytes_mb * 1024 * 1024))
        self.server = HttpServer(self.service, config.server, telemetry=self.telemetry,
                                 status_provider=self.status, metrics_provider=self._extra_metrics,
                                 daemon_actions=actions, shared_memory=self.shared_memory)
        self.grpc: Any = None
        if config.server.grpc_port is not None or config.server.grpc_socket is not None:
            self.grpc = _grpc_server(self.service, config, self.shared_memory)
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._socket_files: list[tuple[Path, int]] = []
        self.starts: StartHistory | None = None  # opened in run(): it writes to the state directory
        self._parts_started = False  # telemetry and MQTT: not when SIGTERM came during the start's loads
        self._stalled_names: list[str] = []  # the model versions the last engine check found stalled

    # --- run -----------------------------------------------------------------------------------------------
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._begin_stop)
        loop.add_signal_handler(signal.SIGHUP, lambda: self._spawn(self._reload()))
        self._record_start()
        activated = activated_sockets(self.environ)  # read once: each front end takes the sockets named for it
        if activated.grpc and self.grpc is None:
            for _, sock in activated.grpc:
                sock.close()
            raise ConfigError(f"systemd passed a gRPC socket ({GRPC_NAME!r}, edged-grpc.socket) but gRPC is off: "
                              'set server.grpc_socket = "/run/edged/grpc.sock", or disable edged-grpc.socket')
        listeners = open_listeners(self.config.server, self.socket_path, self.environ, activated)
        self._socket_files = [(Path(item.address), Path(item.address).stat().st_ino) for item in listeners
                              if item.kind == "uds" and not item.inherited]
        try:
            await self._start(listeners, activated)
        except BaseException:
            # a start that fails once the sockets exist (gRPC's port taken, a TLS or replay file refused) leaves no
            # socket file behind for the next start or a client to trip over: it is unlinked as at a stop
            await self._abandon_start()
            raise
        await self._stop.wait()
        await self._shutdown()
        return 0

    async def _start(self, listeners: list[Listener], activated: Activated) -> None:
        """Everything from the open listeners to READY=1."""
        await self.server.start([listener.socket for listener in listeners])
        for listener in listeners:
            how = "inherited from systemd" if listener.inherited else "opened"
            print(f"edged {__version__}: listening on {listener.kind}:{listener.address} ({how})", flush=True)
        if self.grpc is not None:  # one in-flight limit for both front ends, and one descriptor budget
            limit = self.server.connection_limit
            await self.grpc.start(self.server.body_budget, activated.grpc, self.server.denied,
                                  max_connections=limit.effective, lingering=limit.lingering)
            for address in self.grpc.addresses:
                how = "inherited from systemd" if address in self.grpc.inherited else "opened"
                print(f"edged {__version__}: listening on grpc:{address} ({how})", flush=True)
        if not await self._load_models():
            return  # SIGTERM during the start's loads: no part starts, the stop follows at once
        if self.telemetry is not None:
            self.telemetry.start()
        if self.mqtt is not None:
            self.mqtt.start()
        self._parts_started = True
        self._start_background_tasks()
        summary = self.summary_line()
        if self.starts is not None and self.starts.loop is not None:
            summary = f"{self.starts.loop.message()}; {summary}"
        print(f"edged: ready: {summary}", flush=True)
        if self.notifier is not None:
            self.notifier.ready(summary)

    async def _abandon_start(self) -> None:
        if self.grpc is not None:  # its own socket file, if it had made one (nothing to drain: not ready yet)
            with contextlib.suppress(Exception):
                await self.grpc.stop(0)
        self._remove_socket_files()

    def _begin_stop(self) -> None:
        """SIGTERM/SIGINT: a model load in progress (the start's, or one a client asked for) gives up before its
        next instance rather than holding the stop for the rest of its length; an OTA download or staging stops
        too (it resumes at the next start)."""
        if self.ota is not None:
            self.ota.stop()
        self.service.stop_loading()
        self._stop.set()

    def _record_start(self) -> None:
        self.starts = StartHistory(self.state_dir, self.clock)  # the one clock of this state directory
        loop = self.starts.record_start()
        if loop is not None and self.notifier is not None:
            self.notifier.status(loop.message())

    async def _load_models(self) -> bool:
        """The start's loads; False when SIGTERM came first: the stop does not wait for them (a load gives up
        before its next instance or warm-up run; one stuck in a backend is abandoned at the stop's budget)."""
        loop = asyncio.get_running_loop()
        if self.ota is not None:  # an interrupted update's files are undone before any model loads
            await loop.run_in_executor(None, self.ota.recover_files)
        loading: asyncio.Future[Any] = loop.run_in_executor(None, self.service.start)
        stopping: asyncio.Future[Any] = loop.create_task(self._stop.wait())
        try:
            while True:
                done, _ = await asyncio.wait((loading, stopping), timeout=EXTEND_TIMEOUT_EVERY_S,
                                             return_when=asyncio.FIRST_COMPLETED)
                if loading in done:
                    loading.result()
                    return True
                if stopping in done:
                    # retrieved when it ends, if it ever does before the exit: no "never retrieved" warning
                    loading.add_done_callback(lambda f: f.cancelled() or f.exception())
                    return False
                if self.notifier is not None:  # long loads: keep systemd from timing out the start
                    self.notifier.extend_timeout(int(3 * EXTEND_TIMEOUT_EVERY_S * 1e6))
                    self.notifier.status(f"loading models ({len(self.service.loaded_versions())} loaded so far)")
        finally:
            stopping.cancel()

    def _start_background_tasks(self) -> None:
        interval = self.notifier.watchdog_interval() if self.notifier is not None else None
        # the health board watches for stalled runs with or without systemd's watchdog
        self._spawn(self._watchdog(self.notifier if interval else None,
                                   min(interval or ENGINE_CHECK_EVERY_S, ENGINE_CHECK_EVERY_S)))
        if self.config.models.control_mode == "poll":
            self._spawn(supervised_task(self.health.component("repository_poll"), self._poll_repository))
        self._spawn(supervised_task(self.health.component("memory_pressure"), self._watch_pressure))
        self._spawn(supervised_task(self.health.component("clock_checkpoint"), self._checkpoint_clock))
        if self.ota is not None:
            self._spawn(supervised_task(self.health.component("ota"), self.ota.run))
        if self.mqtt is not None and self.telemetry is not None and self.config.mqtt.telemetry_interval_s > 0:
            telemetry, mqtt = self.telemetry, self.mqtt
            self._spawn(supervised_task(self.health.component("telemetry_publish"),
                                        lambda: self._publish_telemetry(telemetry, mqtt)))

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.append(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task in self._tasks:
            self._tasks.remove(task)
        error = None if task.cancelled() else task.exception()
        if error is not None:
            # its type and str(), not its repr: a UnicodeDecodeError's repr holds every byte it was decoding
            log.error("background task failed: %s: %s", type(error).__name__, error)

    async def _shutdown(self) -> None:
        """One budget ([server] stop_timeout_s, below the unit's TimeoutStopSec) for the whole stop: the HTTP
        drain, the MQTT drain, the telemetry flush and the model unloads share it, so systemd never has to
        SIGKILL a daemon that is still flushing its outbox."""
        budget = StopBudget(self.config.server.stop_timeout_s)
        drain = min(self.config.server.shutdown_timeout_s, budget.left())
        log.info("stopping within %.0f s: finishing requests in flight (up to %.0f s)", budget.total_s, drain)
        if self.notifier is not None:
            self.notifier.stopping()
        for task in list(self._tasks):
            task.cancel()
        if self.grpc is not None:  # both front ends drain at once, within the same share of the budget
            await asyncio.gather(self.grpc.stop(drain), self.server.stop(drain))
        else:
            await self.server.stop(drain)
        self.shared_memory.close()  # after both front ends: no request can still be reading a region
        self._remove_socket_files()
        loop = asyncio.get_running_loop()
        if self.mqtt is not None and self._parts_started:
            await loop.run_in_executor(None, self.mqtt.stop, budget.share(0.5))
        if self.telemetry is not None and self._parts_started:
            await loop.run_in_executor(None, self.telemetry.stop)
        # Requests had their drain above: a version still busy after shutdown_timeout_s more is wedged.
        unload = min(self.config.server.shutdown_timeout_s, budget.left())
        abandoned = await loop.run_in_executor(None, self.service.close, unload)
        self.clock.checkpoint()
        if self.starts is not None:
            self.starts.record_clean_stop()
        print(f"edged: stopped in {budget.spent():.1f} s"
              + (f", {len(abandoned)} unload(s) abandoned at the budget" if abandoned else ""), flush=True)
        if any(item.endswith(" (load)") for item in abandoned):
            # A backend still loading one instance cannot be interrupted, and its thread is an executor's, which
            # the interpreter joins at exit: leave without waiting, so the stop fits the budget. Everything that
            # outlives the process was written above (clock checkpoint, clean stop record).
            logging.shutdown()
            os._exit(0)

    def _remove_socket_files(self) -> None:
        """Unlink the socket files this process bound (closing a server leaves them behind), unless another
        process has replaced them since; inherited sockets belong to systemd and stay."""
        for path, inode in self._socket_files:
            with contextlib.suppress(FileNotFoundError):
                if path.lstat().st_ino == inode:
                    path.unlink()
        self._socket_files = []

    # --- periodic work -------------------------------------------------------------------------------------
    async def _watchdog(self, notifier: SystemdNotifier | None, interval: float) -> None:
        """WATCHDOG=1 (under systemd's watchdog) only while the loop turns and no backend execution is stuck;
        the "engine" component of the health board says which is stuck, and for how long."""
        complained = False
        while True:
            stalled = self._check_engine(fresh=False)
            if stalled:
                if not complained:
                    log.error("engine wedged: %s running longer than %.0f s; withholding watchdog pings",
                              ", ".join(stalled), self.config.models.stall_timeout_s)
                complained = True
            else:
                complained = False
                if notifier is not None:
                    notifier.watchdog()
            await asyncio.sleep(interval)

    def _check_engine(self, fresh: bool) -> list[str]:
        """Mark the "engine" component degraded while a run is past [models] stall_timeout_s, ok once none is;
        the "model/version" stalled. The periodic check rewrites the reason only when the set of stalled versions
        changes (each change is an MQTT status message); a status read (``fresh``) brings its durations up to
        date."""
        limit_s = self.config.models.stall_timeout_s
        stalled = stalled_runs(self.service.longest_runs(), limit_s)
        names = [f"{model}/{version}" for model, version, _ in stalled]
        engine = self.health.component("engine")
        if not stalled:
            engine.ok()
        elif fresh or names != self._stalled_names:
            engine.degraded(stall_reason(stalled, limit_s))
        self._stalled_names = names
        return names

    async def _checkpoint_clock(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(CLOCK_CHECKPOINT_EVERY_S)
            await loop.run_in_executor(None, self.clock.checkpoint)  # an fsync: off the event loop

    async def _poll_repository(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.config.models.poll_interval_s)
            await loop.run_in_executor(None, self.service.poll)
            self.health.component("repository_poll").ok()

    async def _watch_pressure(self) -> None:
        pressure = self.memory.pressure
        if pressure is None:
            return
        while True:
            await asyncio.sleep(self.config.memory.pressure_check_interval_s)
            pressure.check()
            self.health.component("memory_pressure").ok()

    async def _publish_telemetry(self, telemetry: TelemetryService, mqtt: Any) -> None:
        previous: dict[str, Any] | None = None
        while True:
            await asyncio.sleep(self.config.mqtt.telemetry_interval_s)
            snapshot = telemetry.snapshot()
            try:
                payload = summary_payload(snapshot, previous, self.config.mqtt.telemetry_deadband_bytes)
            except EdgedError as e:
                log.warning("telemetry summary not published: %s", e)
                continue
            if payload is not None:
                mqtt.publish_telemetry(payload)
                previous = snapshot
            self.health.component("telemetry_publish").ok()

    async def _reload(self) -> None:
        if self.notifier is not None:
            self.notifier.reloading()
        log.info("SIGHUP: re-reading the config and rescanning the repository")
        problems = [self._reread_config()]
        try:
            # An operator's rescan: the files are in place, so no waiting for them to settle over two polls.
            await asyncio.get_running_loop().run_in_executor(None, lambda: self.service.poll(settle=False))
        except Exception as e:  # a model's own failure is logged by the rescan: this is one of the rescan's
            problems.append(f"rescan failed: {type(e).__name__}: {e}")
            raise
        finally:
            # READY=1 after every RELOADING=1, also after a failure: systemd would otherwise keep the unit
            # "reloading" and refuse the next reload
            if self.notifier is not None:
                self.notifier.ready("; ".join([*filter(None, problems), self.summary_line()]))

    def _reread_config(self) -> str | None:
        """Apply what a changed config file may change at run time (the log level); the failure, or None."""
        if not self.config.source:
            return None
        try:
            fresh = load_config(self.config.source)
        except ConfigError as e:  # its message names the file and the place, never a value (edged.config)
            log.error("SIGHUP: config not reloaded, keeping the running one: %s", e)
            return f"config not reloaded: {e}"
        if changed := restart_keys(self._loaded, fresh):
            log.warning("SIGHUP: changes to %s take effect at the next restart (only [logging] level applies "
                        "now; the rescan reads the running repository)", ", ".join(changed))
        logging.getLogger().setLevel(fresh.logging.level.upper())
        return None

    def _pressure_changed(self, state: Any) -> None:
        log.warning("memory pressure %s: %s", "began" if state.under_pressure else "ended", state.reason)
        if self.telemetry is not None:
            self.telemetry.record_event("memory_pressure" if state.under_pressure else "memory_pressure_end",
                                        None, state.reason)

    # --- reporting -----------------------------------------------------------------------------------------
    def summary_line(self) -> str:
        index = self.service.repository_index()
        ready = sum(1 for entry in index if entry.get("state") == "READY")
        parts = [f"{ready} model version(s) ready"]
        if self.mqtt is not None:
            parts.append("mqtt " + ("connected" if self.mqtt.status().get("connected") else "disconnected"))
        if self.telemetry is not None:
            parts.append(f"telemetry {self.telemetry.choice.name}")
        return "; ".join(parts)

    def status(self) -> dict[str, Any]:
        allocator = self.allocator
        self._check_engine(fresh=True)
        return {
            "version": __version__,
            "pid": os.getpid(),
            "uptime_s": round(time.time() - self.started_at, 1),
            "live": self.service.live,
            "ready": self.service.ready,
            "socket": str(self.socket_path),
            "device_id": self.identity.device_id, "device_id_source": self.identity.source,
            "http_port": self.config.server.http_port,
            "grpc_listeners": list(self.grpc.addresses) if self.grpc is not None else [],
            "grpc": self.grpc.status() if self.grpc is not None else None,
            "model_repository": str(self.repository),
            "model_control_mode": self.config.models.control_mode,
            "models": self.service.repository_index(),
            "mqtt": self.mqtt.status() if self.mqtt is not None else {"enabled": False},
            "ota": self.ota.status() if self.ota is not None else {"enabled": False},
            "memory": {**self._memory_described(), "allocator": allocator.name,
                       "allocator_library": str(allocator.library or ""), "allocator_settings": allocator.settings},
            "telemetry": self._telemetry_status(),
            "health": health_status(self.health),
            "restart_loop": (self.starts.loop.as_dict()
                             if self.starts is not None and self.starts.loop is not None else None),
        }

    def _memory_described(self) -> dict[str, Any]:
        """The memory governor's state; when /proc cannot be read (no file descriptor left) the last one read,
        flagged, so that status and /metrics still answer in the situation they are most needed in."""
        try:
            self._memory_last = self.memory.describe()
        except OSError as e:
            log.warning("memory state not read: %s", e)
            return {**self._memory_last, "error": f"cannot read memory state: {e}"}
        return self._memory_last

    def _telemetry_status(self) -> dict[str, Any]:
        if self.telemetry is None:
            return {"source": "off"}
        snapshot = self.telemetry.snapshot()
        return {"source": self.telemetry.choice.name, "reason": self.telemetry.choice.reason,
                "stale": snapshot["stale"], "last_sample_age_s": snapshot["last_sample_age_s"],
                "bad_lines": snapshot["bad_lines"], "store_rejected": snapshot["store_rejected"],
                "store_dropped": snapshot["store_dropped"], "store_error": snapshot["store_error"]}

    def _extra_metrics(self) -> str:
        self._check_engine(fresh=False)
        lines = [self.memory_metrics(), render_health(self.health),
                 render_stalls(self.service.longest_runs(), self.config.models.stall_timeout_s)]
        if self.mqtt is not None:
            lines.append(self.mqtt.prometheus_lines())
        if self.grpc is not None:  # composed here: serving renders /metrics and never imports grpcapi
            lines.append(self.grpc.prometheus_lines())
        if self.ota is not None:
            from edged.ota import ota_metrics

            lines.append(ota_metrics(self.ota.status()))
        return "".join(lines)

    def memory_metrics(self) -> str:
        described = self._memory_described()
        footprints = MetricFamily("edged_model_memory_bytes", "gauge",
                                  "Measured footprint of each loaded model version.")
        for version in self.service.loaded_versions():
            if version.footprint_bytes is not None:
                footprints.add(version.footprint_bytes, {"model": version.config.name,
                                                         "version": str(version.version)})
        peaks = MetricFamily("edged_model_load_peak_bytes", "gauge",
                             "What loading each version added to the peak RSS (VmHWM).")
        for version in self.service.loaded_versions():
            if version.load_peak_bytes is not None:
                peaks.add(version.load_peak_bytes, {"model": version.config.name, "version": str(version.version)})
        allocator = self.allocator
        return render([
            MetricFamily("edged_memory_budget_bytes", "gauge", "The model memory budget (0: none).")
            .add(described["budget_bytes"] or 0),
            MetricFamily("edged_memory_pressure", "gauge", "1 while the system is under memory pressure.")
            .add(int(described["under_pressure"])),
            footprints,
            peaks,
            MetricFamily("edged_allocator_info", "gauge", "The malloc implementation in use.")
            .add(1, {"allocator": allocator.name}),
        ])


def _state_dir_error(state_dir: Path, problem: str) -> ConfigError:
    return ConfigError(f"state_dir {str(state_dir)!r} cannot be the state directory: {problem}; point state_dir (or "
                       "--state-dir) at a directory edged may create and write")


def _check_state_dir_owner(state_dir: Path) -> None:
    """Refuse a state directory others can write: they could put symlinks or files of their own in place of the
    outbox, the telemetry database, the clock or the OTA journal, which edged then writes through or trusts."""
    info = state_dir.stat()
    if info.st_uid not in (0, os.geteuid()):
        raise _state_dir_error(state_dir, f"it is owned by uid {info.st_uid}, not by edged's user (uid "
                               f"{os.geteuid()}) or root, so another user could replace the files edged keeps there")
    if info.st_mode & stat.S_IWOTH:
        raise _state_dir_error(state_dir, f"it is writable by every user (mode {stat.S_IMODE(info.st_mode):04o}), so "
                               "another user could replace the files edged keeps there; chmod o-w it")


def _repository(config: EdgedConfig, state_dir: Path) -> Path:
    """The served repository; with OTA and none configured, the writable one in the state directory."""
    if config.models.repository:
        return Path(config.models.repository)
    return state_dir / "models" if config.ota.enabled else bundled_models()


def _grpc_server(service: InferenceService, config: EdgedConfig, shared_memory: SharedMemoryRegistry) -> Any:
    """The gRPC front end, imported only when configured: its protobuf messages are the optional ``grpc`` extra."""
    try:
        from edged.grpcapi import GrpcServer
    except ImportError as e:
        raise ConfigError(f"server.grpc_port / server.grpc_socket are set but the gRPC front end cannot be "
                          f"imported ({e}); install edged's grpc extra (protobuf)") from e
    return GrpcServer(service, config.server, shared_memory)


def restart_keys(running: EdgedConfig, fresh: EdgedConfig) -> list[str]:
    """The sections (``[models]``) and top-level keys (``state_dir``) of a re-read config that differ from the
    running one's: all but ``[logging] level`` take effect only when the daemon starts."""
    changed: list[str] = []
    for item in dataclasses.fields(EdgedConfig):
        old, new = getattr(running, item.name), getattr(fresh, item.name)
        if item.name == "logging":
            old, new = dataclasses.replace(old, level="info"), dataclasses.replace(new, level="info")
        if item.name != "source" and old != new:
            changed.append(f"[{item.name}]" if dataclasses.is_dataclass(old) else item.name)
    return changed


def run_daemon(config: EdgedConfig, loaded: EdgedConfig | None = None) -> int:
    """Run the daemon in the foreground until SIGTERM/SIGINT; the return value is the exit status. ``loaded`` is
    the config file as read, before the command line's overrides (``config``)."""
    daemon = Daemon(config, loaded=loaded)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(daemon.run())
    with contextlib.suppress(AttributeError):
        return int(uvloop.run(daemon.run()))
    return asyncio.run(daemon.run())

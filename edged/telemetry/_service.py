"""`TelemetryService`: the part the daemon composes. It owns the sampler thread and the store.

The daemon builds it with the ``[telemetry]`` section, the database path and the engine as `ModelActivity`,
calls `start()` and `stop()`; the serving layer calls `snapshot()` and `render_prometheus()`, the MQTT front
end `snapshot()` (through `summary_payload`). Nothing here starts at construction time.

Every record is stamped with the device elapsed time of the daemon's clock (``clock``, one per state directory,
see `edged.clock`): it keys the history, so a wall clock step (an offline boot in 1970, NTP later) neither
empties nor freezes it. The sample's wall time is kept for display.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from pathlib import Path
from typing import Any

from edged.clock import Clock, DeviceClock, state_file_in
from edged.config import TelemetryConfig
from edged.errors import ConfigKeyError, TelemetryError
from edged.supervision import HealthBoard, SupervisedThread
from edged.telemetry._bad_lines import UnreadFields
from edged.telemetry._db import open_failure
from edged.telemetry._derived import EnergyAttributor, Event, ModelActivity, ThrottleDetector, input_power_mw
from edged.telemetry._sample import Sample
from edged.telemetry._source import SourceChoice, TelemetrySource, choose_source, open_source
from edged.telemetry._store import Record, TelemetryStore
from edged.telemetry._sysfs_read import read_power_mode

log = logging.getLogger(__name__)
_POWER_MODE_EVERY_S = 30.0
# Newest sample older than this many intervals (and at least _STALE_MIN_S): its readings are no longer current.
STALE_INTERVALS = 3
_STALE_MIN_S = 5.0


class TelemetryService:
    def __init__(self, config: TelemetryConfig, database: str, activity: ModelActivity | None = None,
                 source: TelemetrySource | None = None, *, health: HealthBoard | None = None,
                 clock: Clock | None = None) -> None:
        self._config = config
        # Standalone (a tool, a test): a clock of the database's folder, so that its history ages across runs.
        self._clock = clock or DeviceClock(state_file_in(Path(database).parent))
        self._database = database
        self._activity = activity
        self._source = source
        self._choice = SourceChoice(source.name, "given by the caller") if source is not None else None
        self._store: TelemetryStore | None = None
        self._store_error: str | None = None  # why the database is not open (None: open, or not tried yet)
        self._unstored = 0  # samples taken while the database could not be opened
        self._thread: SupervisedThread | None = None
        self._opener: SupervisedThread | None = None
        self._health = health or HealthBoard()
        self._sampler = self._health.component("telemetry_sampler")
        self._writer = self._health.component("telemetry_writer")
        self._elapsed = self._clock.elapsed  # staleness in device time too: a wall-clock step changes nothing
        self._started_at: float | None = None
        self._latest_at: float | None = None
        self.stale_after_s = max(STALE_INTERVALS * config.interval_s, _STALE_MIN_S)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._ended = False
        self._latest: Sample | None = None
        self._latest_power: int | None = None
        self._energy = EnergyAttributor()
        self._throttle = ThrottleDetector(config.over_temp_c)
        self._unread: UnreadFields | None = None  # made with the source, for its name
        self._power_mode: str | None = None
        self._power_mode_checked = -math.inf
        self.samples = 0

    @property
    def choice(self) -> SourceChoice:
        return self._choice or choose_source(self._config)

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("TelemetryService.start() called twice")
        if self._source is None:
            self._choice = choose_source(self._config)
            try:
                self._source = open_source(self._config, self._choice, self._clock)
            except (TelemetryError, ConfigKeyError) as e:  # an unreadable replay file: telemetry is off, the
                # daemon serves on (the reason names the key: [telemetry] replay_file)
                log.error("telemetry source %s cannot start: %s", self._choice.name, e)
                self._sampler.degraded(f"source {self._choice.name} cannot start: {e}")
                self._ended = True
                return
        log.info("telemetry source: %s (%s)", self.choice.name, self.choice.reason)
        if self._source is None:
            self._ended = True
            return
        if not self._open_store():  # live readings go on without it; the history waits for the database
            self._opener = SupervisedThread("edged-telemetry-store", self._reopen_store, self._writer,
                                            backoff_min_s=self._config.restart_backoff_s,
                                            backoff_max_s=self._config.restart_backoff_max_s)
            self._opener.start()
        self._started_at = self._elapsed()
        self._thread = SupervisedThread("edged-telemetry-sampler", self._run, self._sampler,
                                        backoff_min_s=self._config.restart_backoff_s,
                                        backoff_max_s=self._config.restart_backoff_max_s)
        self._thread.start()

    def _open_store(self) -> bool:
        """Open the database and start its writer; on failure, show why on the board (telemetry_writer)."""
        try:
            try:
                Path(self._database).parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise TelemetryError(open_failure(self._database, e)) from e
            store = TelemetryStore(self._database, self._config, health=self._health, clock=self._clock)
        except TelemetryError as e:
            reason = (f"{e}; live readings go on, history is not stored meanwhile (edged retries every "
                      f"{self._config.restart_backoff_max_s:g} s at most)")
            if reason != self._store_error:  # logged once per cause, not once per retry
                log.error("%s", reason)
            self._store_error = reason
            self._writer.degraded(reason)
            return False
        with self._lock:
            if self._stop.is_set():  # stopped while this was opening: nothing may outlive stop()
                store.stop()
                return True
            store.start()
            self._store = store
        if self._store_error is not None:
            log.info("telemetry database %s opened; history is stored again", self._database)
        self._store_error = None
        self._writer.ok()
        return True

    def _reopen_store(self) -> None:
        """Retry opening the database with backoff until it opens or the service stops."""
        delay = self._config.restart_backoff_s
        while not self._stop.wait(delay):
            if self._open_store():
                return
            delay = min(delay * 2, self._config.restart_backoff_max_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.stop()
        if self._source is not None:
            self._source.close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._opener is not None:
            self._opener.stop()
            self._opener.join()  # an open in progress ends within SQLite's busy timeout
            self._opener = None
        if self._store is not None:
            self._store.stop()
            self._store = None

    def wait_samples(self, count: int, timeout: float) -> bool:
        """Block until ``count`` samples were taken (for tools and tests); False on timeout or source end."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self.samples < count:
                left = deadline - time.monotonic()
                if left <= 0 or self._ended:
                    return False
                self._changed.wait(left)
        return True

    def record_event(self, kind: str, subject: str | None = None, detail: str | None = None) -> None:
        """Model load/unload and other events from the daemon; dropped when telemetry is off."""
        if self._store is not None:
            self._store.put_event(Event(self._clock.elapsed(), kind, subject, None, detail, self._clock.wall()))

    def _run(self) -> None:
        source = self._source
        if source is None:
            return
        while not self._stop.is_set():
            try:
                sample = source.next_sample(self._stop)
            except TelemetryError as e:
                log.error("telemetry source %s failed: %s", source.name, e)
                self._sampler.degraded(f"source {source.name} failed: {e}")
                break
            if sample is None:
                if not self._stop.is_set():
                    self._sampler.degraded(f"source {source.name} ended")
                break
            record = self._derive(sample)
            store = self._store  # None until the database opens (see _open_store)
            if store is not None:
                store.put(record)
            else:
                self._unstored += 1
            self._sampler.ok()
        with self._lock:
            self._ended = True
            self._changed.notify_all()

    def _derive(self, sample: Sample) -> Record:
        power = input_power_mw(sample)
        activity = dict(self._activity.model_activity()) if self._activity is not None else {}
        elapsed = sample.elapsed if sample.elapsed is not None else self._clock.elapsed()
        with self._lock:
            models = self._energy.update(elapsed, power, activity)  # intervals in elapsed time: no jumps
            events = self._throttle.update(sample, elapsed) + self._check_power_mode(elapsed)
            self._latest, self._latest_power = sample, power
            if sample.unparsed:
                if self._unread is None:
                    self._unread = UnreadFields(self.choice.name, log)
                self._unread.note(sample.unparsed)
            self._latest_at = self._elapsed()
            self.samples += 1
            self._changed.notify_all()
        events = [dataclasses.replace(e, wall=sample.t) for e in events]
        return Record(sample, power, tuple(models), tuple(events), elapsed=elapsed, wall=sample.t)

    def _check_power_mode(self, t: float) -> list[Event]:
        if t - self._power_mode_checked < _POWER_MODE_EVERY_S:
            return []
        self._power_mode_checked = t
        mode = read_power_mode(Path(self._config.sysfs_root))
        if mode is None or mode == self._power_mode:
            return []
        self._power_mode = mode
        return [Event(t, "power_mode", mode)]

    def snapshot(self) -> dict[str, Any]:
        """The latest sample and derived numbers, JSON-able (``GET /v2/edged/telemetry``)."""
        with self._lock:
            sample, power = self._latest, self._latest_power
            age, stale = self._age()
            out: dict[str, Any] = {
                "source": self.choice.name,
                "source_reason": self.choice.reason,
                "samples": self.samples,
                "t": sample.t if sample else None,
                "sample": sample.to_json() if sample else None,
                "cpu_load_pct": sample.cpu_mean_load() if sample else None,
                "power_in_mw": power,
                "power_mode": self._power_mode,
                "energy_per_inference_mj": self._energy.per_inference_mj(),
                "inferences": dict(self._energy.inferences),
                "energy_mj": dict(self._energy.energy_mj),
                "throttle_counts": dict(self._throttle.counts),
                "unread_fields": self._unread.count if self._unread is not None else 0,
                "throttle_active": sorted(self._throttle.active),
                "stale": stale,
                "last_sample_age_s": None if age is None else round(age, 3),
            }
        store = self._store
        store_error = str(store.error) if store is not None and store.error else self._store_error
        out["store_error"] = store_error
        out["store_dropped"] = (store.dropped if store is not None else 0) + self._unstored
        out["store_rejected"] = store.rejected if store is not None else 0
        source = self._source
        # getattr: a caller's own source (a tool's, a test's) may predate the counter
        out["bad_lines"] = getattr(source, "bad_lines", 0) if source is not None else 0
        return out

    def _age(self) -> tuple[float | None, bool]:
        """(seconds since the newest sample, whether that is too old to be current); lock held."""
        if self._started_at is None:
            return None, False
        now = self._elapsed()
        age = None if self._latest_at is None else now - self._latest_at
        since = now - (self._latest_at if self._latest_at is not None else self._started_at)
        return age, since > self.stale_after_s

    def render_prometheus(self) -> str:
        from edged.telemetry._export import render_prometheus
        return render_prometheus(self.snapshot())

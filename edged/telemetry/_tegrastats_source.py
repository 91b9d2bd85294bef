"""tegrastats as a source: spawned with ``--interval``, read line by line, restarted with backoff on exit.

The child is started in its own process group and only ever stopped by its pid: ``tegrastats --stop`` would
kill every instance on the machine, including ones edged did not start.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time

from edged.config import TelemetryConfig
from edged.errors import TelemetryError, TelemetryParseError
from edged.telemetry._bad_lines import BadLines
from edged.telemetry._sample import Sample
from edged.telemetry.tegrastats import parse_tegrastats

log = logging.getLogger(__name__)


class TegrastatsSource:
    def __init__(self, config: TelemetryConfig) -> None:
        self._config = config
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None
        self._closed = False
        self._backoff = config.restart_backoff_s
        self.restarts = 0  # how many times the child had to be started again
        self._bad = BadLines("tegrastats", log)

    @property
    def name(self) -> str:
        return "tegrastats"

    @property
    def bad_lines(self) -> int:
        """Lines refused by the parser (not tegrastats, or corrupt values); never stored."""
        return self._bad.count

    def _spawn(self) -> subprocess.Popen[str]:
        interval_ms = max(1, round(self._config.interval_s * 1000))
        argv = [self._config.tegrastats_path, "--interval", str(interval_ms)]
        try:
            # errors="replace": a byte that is not UTF-8 (a driver's garbage in a rail name) becomes U+FFFD and
            # costs at most its field, instead of a UnicodeDecodeError that ends every read of the pipe
            return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, encoding="utf-8",
                                    errors="replace", bufsize=1, start_new_session=True)
        except OSError as e:
            raise TelemetryError(f"cannot start {self._config.tegrastats_path}: {e.strerror}; set [telemetry] "
                                 "tegrastats_path to the tegrastats binary, or choose another source (\"auto\" "
                                 "picks what this device has)") from e

    def _current(self) -> subprocess.Popen[str] | None:
        with self._lock:
            if self._closed:
                return None
            if self._proc is None:
                self._proc = self._spawn()
            return self._proc

    def _died(self, proc: subprocess.Popen[str], stop: threading.Event) -> None:
        code = proc.wait()
        with self._lock:
            self._proc = None
        if stop.is_set() or self._closed:
            return
        log.warning("tegrastats exited with status %s; restarting in %.1f s", code, self._backoff)
        stop.wait(self._backoff)
        self._backoff = min(self._backoff * 2, self._config.restart_backoff_max_s)
        self.restarts += 1

    def next_sample(self, stop: threading.Event) -> Sample | None:
        while not stop.is_set():
            proc = self._current()
            if proc is None or proc.stdout is None:
                return None
            line = proc.stdout.readline()
            if not line:
                self._died(proc, stop)
                continue
            try:
                sample = parse_tegrastats(line, t=time.time())
            except TelemetryParseError as e:
                self._bad.note(e)
                continue
            self._backoff = self._config.restart_backoff_s
            return sample
        return None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc is not None and proc.stdout is not None:
            proc.stdout.close()

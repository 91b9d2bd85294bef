"""A fleet on one machine, for the fleet test and scripts/bench_fleet.py: N real `edged serve` daemons (own
state dir, socket, device id), one mosquitto, one nginx serving a TUF repository made by `edged fleet`, and one
client thread hammering every device in turn for the whole run.

Waves follow the rollout bucket formula (`edged.ota._policy.bucket`): `pick_device_ids` chooses ids whose
buckets for the run's cohort salt put about 10 % of the fleet in the first wave, 40 % more in the second and the
rest in the third, so no wave is empty however small the fleet. Checks are nudged over MQTT
(``edged/{id}/ota/check``) and outcomes read from the devices' retained ``edged/{id}/ota/status``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from edged.client import ClientError, EdgedClient
from edged.ota._policy import bucket
from tests.integration.edged_daemon import DaemonProcess, daemon_environment, start_daemon
from tests.mqtt.conftest import Broker, Subscriber
from tests.ota.conftest import MODEL, Nginx, model_folder

SALT = "fleet-sim"
WAVES = (10, 50, 100)


def pick_device_ids(count: int, salt: str = SALT) -> list[str]:
    """``count`` ids: ~10 % with a bucket below 10, ~40 % in [10, 50), the rest in [50, 100); at least one each."""
    first = max(1, count // 10)
    second = max(1, count * 4 // 10)
    wanted = {0: first, 1: second, 2: count - first - second}
    if wanted[2] < 1:
        raise ValueError(f"a fleet of {count} cannot fill three waves")
    chosen: list[str] = []
    k = 0
    while len(chosen) < count:
        name = f"sim-{k:04d}"
        wave = wave_of(bucket(salt, name))
        if wanted[wave] > 0:
            wanted[wave] -= 1
            chosen.append(name)
        k += 1
    return chosen


def wave_of(device_bucket: int) -> int:
    return next(i for i, percent in enumerate(WAVES) if device_bucket < percent)


def in_wave(device_id: str, percent: int, salt: str = SALT) -> bool:
    return bucket(salt, device_id) < percent


def edged(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edged", *args], capture_output=True, text=True,
                          timeout=timeout_s, env=daemon_environment(), check=False)


@dataclass
class Sample:
    device: str
    began: float  # time.monotonic()
    latency_s: float
    version: str


@dataclass
class Hammer:
    """One client thread sending requests to every device in turn; every failure is kept with its device."""

    clients: dict[str, EdgedClient]
    samples: list[Sample] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True, name="fleet-hammer")

    def _run(self) -> None:
        x = np.ones((1, 64), np.float32)
        while not self.stop.is_set():
            for device, client in self.clients.items():
                began = time.monotonic()
                try:
                    version = client.infer(MODEL, {"input": x}).model_version
                except ClientError as e:
                    self.failures.append(f"{device}: {e}")
                    continue
                self.samples.append(Sample(device, began, time.monotonic() - began, version))

    def served(self) -> dict[str, str]:
        """The version each device answered with last."""
        return {s.device: s.version for s in self.samples}


class Fleet:
    def __init__(self, work: Path, count: int, *, hidden: int = 8, watch_s: float = 1.0) -> None:
        self.work = work
        self.hidden = hidden
        self.repo = work / "fleet"
        made = edged("fleet", "init", str(self.repo))
        if made.returncode != 0:
            raise RuntimeError(f"edged fleet init: {made.stderr}")
        self.nginx = Nginx(self.repo, work / "nginx")
        self.broker = Broker(work / "broker", persistence=False)
        self.broker.start()
        self.ids = pick_device_ids(count)
        self.daemons: dict[str, DaemonProcess] = {}
        self.statuses = Subscriber(self.broker.port, ["edged/+/ota/status"], client_id="fleet-watcher")
        self.nudger = paho.Client(CallbackAPIVersion.VERSION2, client_id="fleet-operator")
        self.nudger.connect("127.0.0.1", self.broker.port)
        self.nudger.loop_start()
        self.watch_s = watch_s
        self.hammer = Hammer({})
        try:
            self.started_s = self._start_all()
        except BaseException:
            self.close()  # a daemon that did not start must not leave the others, nginx and mosquitto running
            raise
        self.hammer = Hammer({d: self.daemons[d].client(timeout_s=60) for d in self.ids})

    def _config(self, device: str, models: Path) -> str:
        return f"""[telemetry]
source = "off"
[models]
repository = "{models}"
[mqtt]
broker = "{self.broker.url}"
device_id = "{device}"
[ota]
enabled = true
repository_url = "{self.nginx.url}"
root_file = "{self.repo}/metadata/1.root.json"
check_interval_s = 86400
jitter_s = 86400
watch_s = {self.watch_s}
min_requests = 0
# The simulation is about waves, promote and zero failed requests, with every daemon of the fleet sharing two
# cores: a one-second window's p99 then measures the neighbours' updates, and judged against the quiet baseline
# it rolled a good model back (CI). The p99 verdict has its own tests (test_ota_watch.py); here only errors count.
max_p99_ratio = 1000
"""

    def _start_all(self) -> float:
        """Starts every daemon at once (their start-up overlaps), waits for all; the seconds it took."""
        began = time.monotonic()
        for device in self.ids:
            models = self.work / device / "models"
            model_folder(models, 1, seed=1, hidden=self.hidden)
            self.daemons[device] = start_daemon(self.work / device, config=self._config(device, models), wait=False)
        for daemon in self.daemons.values():
            daemon.wait_ready()
        deadline = time.monotonic() + 60
        while not all(d.client().status()["mqtt"]["connected"] for d in self.daemons.values()):
            if time.monotonic() > deadline:
                raise AssertionError("not every daemon connected to the broker within 60 s")
            time.sleep(0.05)
        return time.monotonic() - began

    # --- the operator's side -------------------------------------------------------------------------------
    def add_model(self, version: int, seed: int, vectors: bytes, percent: int) -> str:
        source = model_folder(self.work / f"src-{version}", version, seed=seed, hidden=self.hidden)
        vectors_file = self.work / f"vectors-{version}.json"
        vectors_file.write_bytes(vectors)
        added = edged("fleet", "add-model", str(self.repo), str(source), "--version", str(version),
                      "--test-vectors", str(vectors_file), "--percent", str(percent), "--cohort-salt", SALT)
        if added.returncode != 0:
            raise RuntimeError(f"edged fleet add-model: {added.stderr}")
        return f"models/{MODEL}/{version}.tar"

    def promote(self, target: str, percent: int) -> subprocess.CompletedProcess[str]:
        return edged("fleet", "promote", str(self.repo), target, "--percent", str(percent), "--broker",
                     self.broker.url, "--max-failures", "0")

    def nudge_all(self) -> float:
        """Publishes a check nudge to every device; the wall time just before the first (`last_check.at` is one)."""
        began = time.time()
        for device in self.ids:
            self.nudger.publish(f"edged/{device}/ota/check", b"", qos=1).wait_for_publish(10)
        return began

    # --- the devices' side ---------------------------------------------------------------------------------
    def hammer_until_each_answered(self, count: int, timeout_s: float = 60) -> None:
        """Waits until every device answered ``count`` more requests (the hammer reaches all of them)."""
        start = self._answered()
        deadline = time.monotonic() + timeout_s
        while True:
            now = self._answered()
            if all(now.get(d, 0) - start.get(d, 0) >= count for d in self.ids):
                return
            if time.monotonic() > deadline or not self.hammer.thread.is_alive():
                raise AssertionError(f"the hammer did not reach every device {count} times: {now}")
            time.sleep(0.02)

    def _answered(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for sample in list(self.hammer.samples):
            counts[sample.device] = counts.get(sample.device, 0) + 1
        return counts

    def latest(self) -> dict[str, dict[str, Any]]:
        with self.statuses.cond:
            messages = list(self.statuses.messages)
        found: dict[str, dict[str, Any]] = {}
        for message in messages:
            found[message.topic.split("/")[1]] = json.loads(message.payload)
        return found

    def wait_checked(self, since: float, settled: Any, timeout_s: float) -> dict[str, dict[str, Any]]:
        """Waits until every device reported a check done after ``since`` (wall time) and ``settled(doc)``."""
        deadline = time.monotonic() + timeout_s
        while True:
            docs = self.latest()
            done = [d for d in self.ids if d in docs and docs[d].get("last_check", {}).get("at", 0) >= since
                    and settled(docs[d])]
            if len(done) == len(self.ids):
                return docs
            if time.monotonic() > deadline:
                missing = {d: docs.get(d, {}).get("state") for d in self.ids if d not in done}
                raise AssertionError(f"devices not settled within {timeout_s} s: {missing}")
            time.sleep(0.05)

    def close(self) -> None:
        self.hammer.stop.set()
        if self.hammer.thread.is_alive():
            self.hammer.thread.join(60)
        for daemon in self.daemons.values():
            daemon.process.terminate()
        for daemon in self.daemons.values():
            daemon.stop(30)
        self.statuses.close()
        self.nudger.loop_stop()
        self.nudger.disconnect()
        self.broker.stop()
        self.nginx.stop()

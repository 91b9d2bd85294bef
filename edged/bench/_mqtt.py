"""The ``mqtt`` transport: a private mosquitto, a private daemon that uses it, load through ``edged.mqtt.loadgen``.

Two measurements per scenario. Request/response: MQTT v5 requests (ResponseTopic + CorrelationData, QoS 1) from
N threads, each with one request outstanding, one row per concurrency level. A QoS 1 pipeline end to end
(publisher → broker → edged → outbox → broker → subscriber): messages/s with at most ``PIPELINE_WINDOW``
messages in flight, latency per message, and every message that never came back counted as an error.

The broker gets an unbounded per-client queue and TCP_NODELAY: mosquitto's default queue silently drops QoS 1
messages to a slow subscriber, and Nagle's algorithm alone adds ~40 ms per reply (docs/field-notes.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from edged.bench._scenario import Scenario
from edged.bench._socket import _Connection, remote_inputs
from edged.bench._stats import Result, summarize
from edged.errors import ClientError, ConfigError, EdgedError
from edged.mqtt.loadgen import PipelineClient, RequestClient, is_error_payload
from edged.protocol import encode_request

Progress = Callable[[str], None]
OutboxMode = Literal["batch", "off", "direct"]  # the outbox with fsync batch or off, or none (paho's queue)

DEVICE_ID = "bench"
REQUEST_LABEL = "mqtt request/response"
PIPELINE_LABEL = "mqtt pipeline qos1"
PIPELINE_STREAMS = 8  # input topics bench/s0/in .. bench/s7/in; results keep the order of their input topic
PIPELINE_WINDOW = 128  # messages in flight: more only adds queueing latency (measured: 64, 128, 256, 1024)
REQUEST_TIMEOUT_S = 10.0
START_TIMEOUT_S = 120.0


@dataclasses.dataclass(frozen=True)
class Daemon:
    broker_url: str
    target: dict[str, Any]  # the daemon's Unix socket, as the uds transport names it
    pid: int


def run_mqtt(scenario: Scenario, repository: Path, progress: Progress) -> list[Result]:
    progress("starting a private mosquitto and a private daemon with [mqtt] and one pipeline")
    with private_daemon(repository, scenario.model) as daemon:
        payload = request_payload(daemon, scenario)
        results = request_rows(daemon, scenario, payload, progress)
        results.append(pipeline_row(daemon, scenario, payload, progress)[0])
    return results


def request_payload(daemon: Daemon, scenario: Scenario) -> bytes:
    body, _ = encode_request(remote_inputs(daemon.target, scenario.model, scenario.batch), binary=False)
    return body


def request_rows(daemon: Daemon, scenario: Scenario, payload: bytes, progress: Progress) -> list[Result]:
    results = []
    with RequestClient(daemon.broker_url, DEVICE_ID) as client:
        client.wait_online(30)
        for concurrency in scenario.concurrency:
            progress(f"{REQUEST_LABEL}: concurrency {concurrency} for {scenario.duration_s:g} s")
            measure_requests(client, "warm-up", scenario, payload, concurrency, scenario.warmup_s)
            results.append(measure_requests(client, REQUEST_LABEL, scenario, payload, concurrency,
                                            scenario.duration_s))
    return results


def measure_requests(client: RequestClient, label: str, scenario: Scenario, payload: bytes, concurrency: int,
                     duration_s: float) -> Result:
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    deadline = time.perf_counter() + duration_s

    def worker() -> None:
        mine: list[float] = []
        errors: list[str] = []
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            try:
                reply = client.request(scenario.model, payload, REQUEST_TIMEOUT_S)
            except EdgedError as e:
                errors.append(str(e))
                continue
            if is_error_payload(reply):
                errors.append(reply[:300].decode("utf-8", "replace"))
            else:
                mine.append((time.perf_counter() - start) * 1e6)
        with lock:
            latencies.extend(mine)
            failures.extend(errors)

    started = time.perf_counter()
    threads = [threading.Thread(target=worker, name=f"edged-bench-mqtt-{i}") for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    if failures and not latencies:
        raise ClientError(f"every MQTT request failed ({failures[0]}); is model {scenario.model} loaded?")
    return summarize(label, "mqtt", scenario.model, concurrency, scenario.batch, latencies, len(failures), seconds)


def pipeline_row(daemon: Daemon, scenario: Scenario, payload: bytes, progress: Progress) -> tuple[Result, float]:
    """The pipeline's Result (throughput in messages/s, errors = lost + failed) and the daemon's CPU seconds
    per message."""
    progress(f"{PIPELINE_LABEL}: {PIPELINE_WINDOW} in flight for {scenario.duration_s:g} s")
    measure_pipeline(daemon, "warm-up", scenario, payload, scenario.warmup_s)
    cpu_before = cpu_seconds(daemon.pid)
    result = measure_pipeline(daemon, PIPELINE_LABEL, scenario, payload, scenario.duration_s)
    cpu = (cpu_seconds(daemon.pid) - cpu_before) / max(1, result.requests)
    progress(f"{PIPELINE_LABEL}: {result.requests} messages back, {result.errors} lost or failed, "
             f"{result.throughput:.0f} msg/s, daemon CPU {cpu * 1e6:.0f} µs per message")
    return result, cpu


def measure_pipeline(daemon: Daemon, label: str, scenario: Scenario, payload: bytes, duration_s: float) -> Result:
    with PipelineClient(daemon.broker_url, "bench/+/out") as client:  # one connection both ways: less CPU
        sent: list[list[float]] = [[] for _ in range(PIPELINE_STREAMS)]
        published = refused = 0
        started = time.perf_counter()
        deadline = started + duration_s
        while time.perf_counter() < deadline:
            if published - client.count >= PIPELINE_WINDOW:
                client.wait_count(published - PIPELINE_WINDOW + 1, 0.05)
                continue
            stream = published % PIPELINE_STREAMS
            sent[stream].append(time.perf_counter())
            if not client.send(f"bench/s{stream}/in", payload):
                refused += 1
            published += 1
        received = client.wait_count(published - refused, max(5.0, duration_s))
        latencies: list[float] = []
        last = started
        for stream, times in enumerate(sent):
            arrivals = client.arrivals(f"bench/s{stream}/out")
            latencies += [(done - begun) * 1e6 for begun, done in zip(times, arrivals, strict=False)]
            last = max([last, *arrivals[-1:]])
        seconds = last - started
        result = summarize(label, "mqtt", scenario.model, PIPELINE_WINDOW, scenario.batch, latencies,
                           published - received + client.errors, seconds)
        return dataclasses.replace(result, requests=received,
                                   throughput=received / seconds if seconds > 0 else 0.0)


# --- the private broker and daemon ---------------------------------------------------------------------------
@contextlib.contextmanager
def private_daemon(repository: Path, model: str, outbox: OutboxMode = "batch") -> Iterator[Daemon]:
    with tempfile.TemporaryDirectory(prefix="edged-bench-mqtt-") as tmp, private_broker(Path(tmp)) as url:
        config = Path(tmp) / "edged.toml"
        config.write_text(daemon_config(url, model, outbox), encoding="utf-8")
        sock = os.path.join(tmp, "edged.sock")
        log_path = Path(tmp) / "edged.log"
        command = [sys.executable, "-m", "edged", "serve", "--config", str(config), "--socket", sock,
                   "--model-repository", str(repository), "--state-dir", tmp, "--log-level", "warning"]
        with open(log_path, "wb") as log:
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
        try:
            target: dict[str, Any] = {"unix": sock}
            _wait_daemon(process, target, log_path)
            yield Daemon(url, target, process.pid)
        finally:
            _end(process)


def daemon_config(broker_url: str, model: str, outbox: OutboxMode) -> str:
    enabled = outbox != "direct"
    fsync = outbox if outbox != "direct" else "batch"
    return (f'[telemetry]\nsource = "off"\n\n'  # measure serving alone
            f"[mqtt]\nbroker = {json.dumps(broker_url)}\ndevice_id = {json.dumps(DEVICE_ID)}\n\n"
            f"[mqtt.outbox]\nenabled = {str(enabled).lower()}\nfsync = {json.dumps(fsync)}\n\n"
            f'[[mqtt.pipelines]]\ninput = "bench/+/in"\nmodel = {json.dumps(model)}\noutput = "bench/{{1}}/out"\n'
            f"qos = 1\nmax_in_flight = {2 * PIPELINE_WINDOW}\n")


def _wait_daemon(process: subprocess.Popen[bytes], target: dict[str, Any], log_path: Path) -> None:
    """Until the daemon's status route says it is ready and connected to the broker."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            status = _Connection(target).get_json("/v2/edged/status")
            if status.get("ready") and status.get("mqtt", {}).get("connected"):
                return
        except (OSError, ClientError, ValueError):
            pass  # not listening yet
        if process.poll() is not None or time.monotonic() > deadline:
            tail = log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
            state = f"exited with {process.returncode}" if process.poll() is not None else "was not ready"
            raise ClientError(f"the bench's private daemon {state} within {START_TIMEOUT_S:.0f} s: {tail}")
        time.sleep(0.05)


@contextlib.contextmanager
def private_broker(directory: Path) -> Iterator[str]:
    """A mosquitto on a free loopback port; yields its URL."""
    binary = shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.access(p, os.X_OK)), None)
    if binary is None:
        raise ConfigError("the mqtt transport starts a private broker and needs mosquitto: install the "
                          "\"mosquitto\" package (apt-get install mosquitto); none found on PATH or in /usr/sbin")
    port = _free_port()
    conf = directory / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\nmax_queued_messages 1000000\n"
                    "max_inflight_messages 0\nset_tcp_nodelay true\nlog_dest stderr\nlog_type error\n"
                    "log_type warning\n", encoding="utf-8")
    log_path = directory / "mosquitto.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([binary, "-c", str(conf)], stdout=log, stderr=log)
    try:
        _wait_port(process, port, log_path)
        yield f"mqtt://127.0.0.1:{port}"
    finally:
        _end(process)


def _wait_port(process: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and process.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    tail = log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
    raise ClientError(f"the bench's private mosquitto does not listen on 127.0.0.1:{port} (exit status "
                      f"{process.poll()}): {tail}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _end(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

"""Benchmark the MQTT front end against a local mosquitto that this script starts.

    .venv/bin/python scripts/bench_mqtt.py [--requests 500] [--messages 10000]

1. request/response latency at concurrency 1 (MQTT v5, ResponseTopic + CorrelationData, QoS 0 and QoS 1);
2. a QoS 1 pipeline end to end (publisher → edged → subscriber): messages/s and loss;
3. the outbox's CPU cost: the same pipeline with the outbox (fsync batch, fsync off) and publishing directly,
   CPU seconds of the edged process per message.

edged runs in a child process (this script with --serve) so that its CPU time is measured alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

ROOT = Path(__file__).resolve().parents[1]
DEVICE = "bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_broker(directory: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    conf = directory / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\nmax_queued_messages 0\n"
                    "max_inflight_messages 0\nset_tcp_nodelay true\n")
    broker = subprocess.Popen([shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(conf)],
                              stderr=subprocess.DEVNULL)
    wait_port(port)
    return broker, port


def wait_port(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nothing listens on {port}")


# --- the edged side (child process) --------------------------------------------------------------------------
def serve(port: int, state: Path, outbox: str) -> None:
    from edged.config import ModelsConfig, MqttConfig, OutboxConfig, PipelineConfig
    from edged.engine import InferenceService
    from edged.mqtt import MqttFrontEnd

    enabled = outbox != "direct"
    config = MqttConfig(broker=f"mqtt://127.0.0.1:{port}", device_id=DEVICE,
                        outbox=OutboxConfig(enabled=enabled, fsync=outbox if enabled else "batch"),  # type: ignore[arg-type]
                        pipelines=(PipelineConfig(input="bench/+/in", model="tiny_mlp", output="bench/{1}/out",
                                                  qos=1, max_in_flight=256),))
    service = InferenceService(ROOT / "models", ModelsConfig())
    service.start()
    front = MqttFrontEnd(service, config, state, version="bench")
    front.start()
    sys.stdin.readline()  # the parent closes stdin to stop us
    front.stop(10)
    service.close()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- the client side -------------------------------------------------------------------------------------------
class Client:
    def __init__(self, port: int, topics: list[str]) -> None:
        self.cond = threading.Condition()
        self.received: list[paho.MQTTMessage] = []
        self.client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        self.client.on_message = self._on_message
        self.client.max_inflight_messages_set(0)
        self.client.connect("127.0.0.1", port)
        self.client.socket().setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if topics:
            self.client.subscribe([(t, 1) for t in topics])
        self.client.loop_start()

    def _on_message(self, client: Any, userdata: Any, msg: paho.MQTTMessage) -> None:
        with self.cond:
            self.received.append(msg)
            self.cond.notify_all()

    def wait_count(self, count: int, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while len(self.received) < count and time.monotonic() < deadline:
                self.cond.wait(0.1)
            return len(self.received)


def wait_online(port: int) -> None:
    probe = Client(port, [f"edged/{DEVICE}/status"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if any(json.loads(m.payload).get("state") == "online" for m in list(probe.received)):
            break
        probe.wait_count(len(probe.received) + 1, 0.5)
    probe.client.loop_stop()
    probe.client.disconnect()


def request_latency(port: int, count: int, qos: int) -> dict[str, float]:
    reply = f"bench/replies/{uuid.uuid4().hex}"
    client = Client(port, [reply])
    time.sleep(0.2)
    body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64],
                                   "data": [0.5] * 64}]}).encode()
    samples = []
    for index in range(count + 20):
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = reply
        props.CorrelationData = index.to_bytes(4, "big")
        start = time.perf_counter()
        client.client.publish(f"edged/{DEVICE}/infer/tiny_mlp", body, qos, properties=props)
        client.wait_count(index + 1, 5)
        if index >= 20:  # warm-up
            samples.append((time.perf_counter() - start) * 1000)
    client.client.loop_stop()
    client.client.disconnect()
    samples.sort()
    return {"p50_ms": statistics.median(samples), "p99_ms": samples[int(len(samples) * 0.99) - 1]}


def pipeline_run(port: int, count: int, pid: int) -> dict[str, float]:
    sub = Client(port, ["bench/+/out"])
    pub = Client(port, [])
    time.sleep(0.2)
    payload = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64],
                                      "data": np.random.default_rng(0).random(64).round(4).tolist()}]}).encode()
    cpu0, start = cpu_seconds(pid), time.perf_counter()
    for index in range(count):
        pub.client.publish(f"bench/s{index % 8}/in", payload, 1)
    got = sub.wait_count(count, 120)
    elapsed, cpu = time.perf_counter() - start, cpu_seconds(pid) - cpu0
    for c in (sub, pub):
        c.client.loop_stop()
        c.client.disconnect()
    return {"messages": count, "received": got, "lost": count - got, "msg_per_s": got / elapsed,
            "edged_cpu_us_per_msg": cpu / max(1, got) * 1e6}


def run_variant(port: int, outbox: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    state = work / f"state-{outbox}"
    child = subprocess.Popen([sys.executable, __file__, "--serve", str(port), str(state), outbox],
                             stdin=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        wait_online(port)
        result: dict[str, Any] = {"outbox": outbox}
        if outbox == "batch":
            result["request_qos0"] = request_latency(port, args.requests, 0)
            result["request_qos1"] = request_latency(port, args.requests, 1)
        pipeline_run(port, 1000, child.pid)  # warm-up
        result["pipeline"] = pipeline_run(port, args.messages, child.pid)
        return result
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--messages", type=int, default=10000)
    parser.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(int(args.serve[0]), Path(args.serve[1]), args.serve[2])
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        broker, port = start_broker(Path(tmp))
        try:
            results = [run_variant(port, v, args, Path(tmp)) for v in ("batch", "off", "direct")]
        finally:
            broker.terminate()
            broker.wait(10)
    for r in results:
        print(json.dumps(r))
    direct = results[2]["pipeline"]["edged_cpu_us_per_msg"]
    for r in results[:2]:
        extra = r["pipeline"]["edged_cpu_us_per_msg"] / direct - 1
        print(f"outbox fsync={r['outbox']}: {extra:+.1%} edged CPU per message vs direct publishing")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fixtures for the MQTT front end: real mosquitto brokers on free ports, a real engine, real SQLite."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edged.config import ModelsConfig
from edged.engine import InferenceService

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
IMAGE_PARAMETERS = """
parameters { key: "image_size" value: { string_value: "8x8" } }
parameters { key: "image_layout" value: { string_value: "FLAT" } }
parameters { key: "image_color" value: { string_value: "gray" } }
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Broker:
    """A mosquitto process the test can stop, kill and restart on the same port and persistence dir."""

    def __init__(self, directory: Path, persistence: bool = True) -> None:
        self.port = free_port()
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.config = directory / "mosquitto.conf"
        lines = [f"listener {self.port} 127.0.0.1", "allow_anonymous true", "max_queued_messages 0",
                 "max_inflight_messages 0", "set_tcp_nodelay true", "log_dest stderr", "log_type error",
                 "log_type warning"]
        if persistence:
            lines += ["persistence true", f"persistence_location {directory}/", "autosave_interval 1"]
            if os.geteuid() == 0:  # mosquitto started as root drops to user mosquitto: let it write there
                lines.append("user root")
        self.config.write_text("\n".join(lines) + "\n")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> None:
        log = open(self.directory / "mosquitto.log", "ab")  # noqa: SIM115 - lives as long as the process
        self.process = subprocess.Popen([MOSQUITTO, "-c", str(self.config)], stdout=log, stderr=log)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.process.poll() is not None:
                    log_text = (self.directory / "mosquitto.log").read_text()
                    raise RuntimeError(f"mosquitto exited: {log_text}") from None
                time.sleep(0.02)
        raise RuntimeError("mosquitto did not start listening")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(10)
        self.process = None


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path / "broker")
    b.start()
    yield b
    b.stop()


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled models, with digits_onnx declaring image preprocessing (8x8 gray, flattened)."""
    root = tmp_path_factory.mktemp("models")
    for name in ("digits_onnx", "tiny_mlp"):
        shutil.copytree(MODELS / name, root / name)
    config = root / "digits_onnx" / "config.pbtxt"
    config.write_text(config.read_text() + IMAGE_PARAMETERS)
    return root


@pytest.fixture(scope="session")
def service(repository: Path) -> Iterator[InferenceService]:
    svc = InferenceService(repository, ModelsConfig())
    svc.start()
    yield svc
    svc.close()


class Subscriber:
    """A test-side MQTT client that records what arrives."""

    def __init__(self, port: int, topics: list[str], protocol: int = paho.MQTTv5,
                 client_id: str = "", persistent: bool = False, qos: int = 1) -> None:
        self.qos = qos
        self.messages: list[paho.MQTTMessage] = []
        self.cond = threading.Condition()
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol,
                                  clean_session=None if protocol == paho.MQTTv5 else not persistent)
        self.client.on_message = self._on_message
        self.client.on_connect = self._on_connect
        self.topics = topics
        self._connected = threading.Event()
        props = None
        if protocol == paho.MQTTv5:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = 3600 if persistent else 0
        self.client.connect_async("127.0.0.1", port, 30, clean_start=not persistent, properties=props) \
            if protocol == paho.MQTTv5 else self.client.connect_async("127.0.0.1", port, 30)
        self.client.reconnect_delay_set(0.1, 0.5)  # type: ignore[arg-type]
        self.client.loop_start()
        if not self._connected.wait(10):
            raise RuntimeError("test subscriber could not connect")

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        if self.topics:
            client.subscribe([(t, self.qos) for t in self.topics])
            self._subscribed = True
        self._connected.set()

    def _on_message(self, client: Any, userdata: Any, msg: paho.MQTTMessage) -> None:
        with self.cond:
            self.messages.append(msg)
            self.cond.notify_all()

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[paho.MQTTMessage]:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while len(self.messages) < count and time.monotonic() < deadline:
                self.cond.wait(deadline - time.monotonic())
            return list(self.messages)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def wait_until(predicate: Any, timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def python() -> str:
    return sys.executable


def env_with_root() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env

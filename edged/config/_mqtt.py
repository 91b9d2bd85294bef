"""The ``[mqtt]`` section and its ``[[mqtt.pipelines]]``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


def _qos(value: int) -> str | None:
    return None if value in (0, 1, 2) else "expected a QoS of 0, 1 or 2"


def _positive(value: float) -> str | None:
    return None if value > 0 else "expected a positive number"


@dataclass(frozen=True)
class PipelineConfig:
    input: str
    model: str
    output: str
    version: str | None = None
    codec: Literal["json", "binary", "raw", "image"] = "json"
    input_name: str | None = None  # for raw and image payloads: the model input they fill
    qos: int = field(default=1, metadata={"check": _qos})
    max_in_flight: int = field(default=64, metadata={"check": _positive})
    backpressure: Literal["block", "drop_oldest"] = "block"
    postprocess: Literal["none", "topk"] = "none"
    top_k: int = field(default=5, metadata={"check": _positive})
    labels: str | None = None  # a label file; default: the output's label_filename in config.pbtxt


@dataclass(frozen=True)
class OutboxConfig:
    # false: QoS>=1 messages go straight to paho's in-memory queue (lost on a restart); for benchmarks and
    # devices that do not need durability.
    enabled: bool = True
    max_messages: int = field(default=100_000, metadata={"check": _positive})
    max_bytes: int = field(default=256 * 1024 * 1024, metadata={"check": _positive})
    max_age_s: float = field(default=7 * 24 * 3600.0, metadata={"check": _positive})
    fsync: Literal["always", "batch", "off"] = "batch"
    max_in_flight: int = field(default=256, metadata={"check": _positive})


@dataclass(frozen=True)
class MqttConfig:
    broker: str | None = None  # mqtt://host:port or mqtts://host:port; None: MQTT is off
    device_id: str | None = None  # None: derived from /etc/machine-id, else the host name
    protocol: Literal["5", "3.1.1"] = "5"
    username: str | None = None
    password_file: str | None = None  # or the systemd credential "mqtt-password"
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    tls_insecure: bool = False
    keepalive_s: int = field(default=30, metadata={"check": _positive})
    session_expiry_s: int = field(default=24 * 3600, metadata={"check": _positive})
    reconnect_min_s: float = field(default=0.5, metadata={"check": _positive})
    reconnect_max_s: float = field(default=30.0, metadata={"check": _positive})
    qos: int = field(default=1, metadata={"check": _qos})
    max_payload_bytes: int = field(default=16 * 1024 * 1024, metadata={"check": _positive})
    request_workers: int = field(default=4, metadata={"check": _positive})
    telemetry_interval_s: float = 60.0
    telemetry_deadband_bytes: int = 2048
    outbox: OutboxConfig = OutboxConfig()
    pipelines: tuple[PipelineConfig, ...] = ()

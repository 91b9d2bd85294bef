"""Connection settings derived from the ``[mqtt]`` section: broker URL, identity, credentials, TLS."""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from edged.config import MqttConfig
from edged.errors import ConfigError, ConfigKeyError

CREDENTIAL_NAME = "mqtt-password"
PACKET_ROOM = 1024 * 1024  # a PUBLISH's topic, ResponseTopic, CorrelationData and user properties
MQTT_MAX_PACKET = 268_435_455 + 5  # the largest remaining length and its fixed header
_SAFE_ID = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class ConnectionSettings:
    host: str
    port: int
    tls: bool
    protocol: str  # "5" or "3.1.1"
    client_id: str
    keepalive_s: int
    session_expiry_s: int
    reconnect_min_s: float
    reconnect_max_s: float
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    tls_insecure: bool = False
    receive_maximum: int | None = None  # v5: unacknowledged inputs the broker may send at once (None: its 65535)
    maximum_packet_size: int | None = None  # v5: the largest packet the broker may send (packet_size_of)


def receive_maximum_of(config: MqttConfig) -> int | None:
    """The smallest ``max_in_flight`` of the pipelines that block, or None. Inputs are acknowledged only once their
    results are stored, so with this many at most unacknowledged the broker can never fill such a pipeline's
    queue: the network thread then never stops reading, and keeps reading the PUBACKs that make room in a full
    outbox (a worker waiting for that room is the backpressure; the broker holds the rest)."""
    blocking = [p.max_in_flight for p in config.pipelines if p.backpressure == "block"]
    return min(*blocking, 65535) if blocking else None


def packet_size_of(config: MqttConfig) -> int:
    """edged's v5 Maximum Packet Size: ``max_payload_bytes`` plus room for a packet's topic and properties
    (``PACKET_ROOM``), within MQTT's largest packet. The broker then discards a larger PUBLISH for edged instead
    of sending it, so that a sender cannot make edged read (and hold, several copies at once) a payload up to
    the broker's own limit (mosquitto's is 256 MB) only to refuse it. A payload just over the limit still reaches
    edged and is answered with an error."""
    return min(config.max_payload_bytes + PACKET_ROOM, MQTT_MAX_PACKET)


def device_id_of(config: MqttConfig) -> str:
    """The device id used in topics and the client id: configured, else the host name, made topic-safe."""
    raw = config.device_id or socket.gethostname() or "edged"
    return _SAFE_ID.sub("_", raw)


def parse_broker(url: str) -> tuple[str, int, bool]:
    """(host, port, tls) from ``mqtt://host[:port]`` or ``mqtts://host[:port]`` (a bare host:port is mqtt)."""
    parts = urlsplit(url if "://" in url else f"mqtt://{url}")
    if "@" in parts.netloc:  # checked first, and the URL never quoted: it may hold a password
        raise ConfigKeyError("mqtt.broker", "a user name or password in the URL is not used; set [mqtt] username "
                             "and password_file (or the systemd credential mqtt-password) and remove them from the URL")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigKeyError("mqtt.broker", f"{url!r} has a path, query or fragment, which MQTT over TCP has no use "
                             "for; expected mqtt://host:port or mqtts://host:port")
    if parts.scheme not in ("mqtt", "mqtts", "tcp", "ssl"):
        raise ConfigKeyError("mqtt.broker", f"expected mqtt://host:port or mqtts://host:port, found {url!r}")
    tls = parts.scheme in ("mqtts", "ssl")
    if not parts.hostname:
        raise ConfigKeyError("mqtt.broker", f"no host in {url!r}")
    try:
        port = parts.port or (8883 if tls else 1883)
    except ValueError as e:
        raise ConfigKeyError("mqtt.broker", f"bad port in {url!r}") from e
    return parts.hostname, port, tls


def read_password(config: MqttConfig, environ: dict[str, str] | None = None) -> str | None:
    """The password from ``password_file``, else the systemd credential, else None. Never from argv."""
    env = os.environ if environ is None else environ
    candidates = []
    if config.password_file:
        candidates.append(Path(config.password_file))
    elif env.get("CREDENTIALS_DIRECTORY"):
        candidates.append(Path(env["CREDENTIALS_DIRECTORY"]) / CREDENTIAL_NAME)
    for path in candidates:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            if config.password_file:
                raise ConfigKeyError("mqtt.password_file", f"{path} does not exist") from None
            continue
        except OSError as e:  # its strerror only: str(e) repeats the path in Python's quoting
            raise _password_error(config, f"cannot read {path}: {e.strerror}; the file must be readable by "
                                  "edged's user") from e
        try:
            return raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as e:
            bad_byte = e.start
        # outside the except block: the UnicodeDecodeError holds the password, and its repr shows it
        raise _password_error(config, f"{path} is not UTF-8 text (byte {bad_byte}); save it as UTF-8")
    return None


def _password_error(config: MqttConfig, problem: str) -> ConfigError:
    """Named by its key when ``password_file`` set the file, else as the systemd credential it was."""
    if config.password_file:
        return ConfigKeyError("mqtt.password_file", problem)
    return ConfigError(f"systemd credential {CREDENTIAL_NAME}: {problem}")


def connection_settings(config: MqttConfig, environ: dict[str, str] | None = None) -> ConnectionSettings:
    if not config.broker:
        raise ConfigError("mqtt.broker is not set")
    host, port, tls = parse_broker(config.broker)
    return ConnectionSettings(
        host=host, port=port, tls=tls or config.ca_file is not None, protocol=config.protocol,
        client_id=f"edged-{device_id_of(config)}", keepalive_s=config.keepalive_s,
        session_expiry_s=config.session_expiry_s, reconnect_min_s=config.reconnect_min_s,
        reconnect_max_s=max(config.reconnect_min_s, config.reconnect_max_s), username=config.username,
        password=read_password(config, environ), ca_file=config.ca_file, cert_file=config.cert_file,
        key_file=config.key_file, tls_insecure=config.tls_insecure, receive_maximum=receive_maximum_of(config),
        maximum_packet_size=packet_size_of(config))

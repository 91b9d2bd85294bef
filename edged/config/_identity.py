"""The device id: one per device, used by the MQTT topics, the OTA status topic and the OTA rollout bucket.

Resolved once at start-up, in this order: an explicit ``[mqtt] device_id`` or ``[ota] device_id`` (both may be
given only if they are equal: two ids for one device would put its status and its rollout wave on different
names), then an id derived from ``/etc/machine-id`` (cloned images share a hostname, systemd regenerates the
machine id on first boot), then the host name, reported as possibly not unique. The id is a single MQTT topic
level, so an explicit one with other characters than letters, digits, ``_``, ``.`` and ``-`` is refused.
"""

from __future__ import annotations

import hashlib
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from edged.errors import ConfigError

MACHINE_ID = Path("/etc/machine-id")
_SAFE = re.compile(r"^[A-Za-z0-9_.-]+$")
_UNSAFE_CHAR = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class DeviceIdentity:
    device_id: str
    source: str  # "[mqtt] device_id", "[ota] device_id", "machine-id" or "hostname (...)"


def resolve_device_identity(mqtt_id: str | None, ota_id: str | None, machine_id: Path = MACHINE_ID,
                            hostname: str | None = None) -> DeviceIdentity:
    if mqtt_id and ota_id and mqtt_id != ota_id:
        raise ConfigError(f"[mqtt] device_id {mqtt_id!r} and [ota] device_id {ota_id!r} differ: a device has one "
                          "id (its topics and its rollout wave use it); set one of them, or both to the same value")
    for value, key in ((mqtt_id, "[mqtt] device_id"), (ota_id, "[ota] device_id")):
        if value:
            if not _SAFE.match(value) or len(value) > 128:
                raise ConfigError(f"{key}: expected 1 to 128 letters, digits, '_', '.' or '-' (it is one MQTT "
                                  f"topic level), found {value!r}")
            return DeviceIdentity(value, key)
    try:
        raw = machine_id.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        raw = ""
    if raw:
        # hashed: /etc/machine-id is confidential (systemd's advice); the derived id is stable and unique
        return DeviceIdentity("edged-" + hashlib.sha256(f"edged:{raw}".encode()).hexdigest()[:16], "machine-id")
    name = _UNSAFE_CHAR.sub("_", hostname if hostname is not None else socket.gethostname()) or "edged"
    return DeviceIdentity(name, f"hostname (no {machine_id}: may not be unique in a fleet)")

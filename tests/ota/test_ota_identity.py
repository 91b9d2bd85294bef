"""One device id for MQTT topics, the OTA status topic and the rollout bucket: explicit in either section, else
derived from /etc/machine-id, else the host name; conflicting explicit ids are refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edged.config import resolve_device_identity
from edged.errors import ConfigError
from tests.integration.edged_daemon import daemon_environment, start_daemon
from tests.mqtt.conftest import Broker, wait_until
from tests.ota.conftest import Nginx, model_folder


def test_an_explicit_id_in_either_section_is_the_one_id() -> None:
    assert resolve_device_identity("cam-1", None).device_id == "cam-1"
    assert resolve_device_identity(None, "cam-1").source == "[ota] device_id"
    assert resolve_device_identity("cam-1", "cam-1").source == "[mqtt] device_id"


def test_conflicting_explicit_ids_are_refused_naming_both() -> None:
    with pytest.raises(ConfigError, match=r"\[mqtt\] device_id 'cam-1' and \[ota\] device_id 'cam-2' differ"):
        resolve_device_identity("cam-1", "cam-2")


def test_an_id_that_is_not_one_topic_level_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"\[ota\] device_id: expected .* found 'cam/1'"):
        resolve_device_identity(None, "cam/1")


def test_the_default_comes_from_machine_id_then_the_host_name(tmp_path: Path) -> None:
    machine_id = tmp_path / "machine-id"
    machine_id.write_text("0123456789abcdef0123456789abcdef\n")
    derived = resolve_device_identity(None, None, machine_id)
    assert derived.source == "machine-id" and derived.device_id.startswith("edged-")
    assert "0123456789abcdef" not in derived.device_id  # the machine id itself stays private
    fallback = resolve_device_identity(None, None, tmp_path / "absent", hostname="jetson#1")
    assert fallback.device_id == "jetson_1" and "may not be unique" in fallback.source


def test_the_daemon_uses_the_mqtt_device_id_for_ota_and_says_where_it_came_from(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "broker", persistence=False)
    broker.start()
    models = tmp_path / "models"
    model_folder(models, 1, seed=1, hidden=8)
    nginx = Nginx(tmp_path, tmp_path / "nginx")
    config = f"""[telemetry]
source = "off"
[models]
repository = "{models}"
[mqtt]
broker = "{broker.url}"
device_id = "cam-9"
[ota]
enabled = true
repository_url = "{nginx.url}"
root_file = "{tmp_path}/absent-root.json"
check_interval_s = 86400
jitter_s = 86400
"""
    daemon = start_daemon(tmp_path / "daemon", config=config)
    try:
        client = daemon.client()
        wait_until(lambda: client.status()["mqtt"]["connected"], 30, "the daemon's MQTT connection")
        status = client.status()
        assert status["ota"]["device_id"] == "cam-9" and status["mqtt"]["device_id"] == "cam-9"
        assert status["device_id"] == "cam-9" and status["device_id_source"] == "[mqtt] device_id"
        assert status["ota"]["device_id_source"] == "[mqtt] device_id"
    finally:
        daemon.stop()
        nginx.stop()
        broker.stop()


def test_the_daemon_refuses_to_start_with_two_different_ids(tmp_path: Path) -> None:
    config = tmp_path / "edged.toml"
    config.write_text('[telemetry]\nsource = "off"\n[mqtt]\nbroker = "mqtt://127.0.0.1:1"\ndevice_id = "cam-1"\n'
                      '[ota]\nenabled = true\nrepository_url = "http://127.0.0.1:1"\ndevice_id = "cam-2"\n')
    done = subprocess.run([sys.executable, "-m", "edged", "serve", "--config", str(config), "--socket",
                           str(tmp_path / "s.sock"), "--state-dir", str(tmp_path / "state")],
                          capture_output=True, text=True, timeout=60, env=daemon_environment(), check=False)
    assert done.returncode != 0
    assert "[mqtt] device_id 'cam-1' and [ota] device_id 'cam-2' differ" in done.stderr

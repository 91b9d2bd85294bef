"""TLS files that cannot be used (missing, unreadable, not what they should hold, an encrypted key) stop the MQTT
front end with one error naming the key and the file, and `edged serve` says where the value came from: the config
file or the flag. Review: paho's error named neither key ("Invalid argument", or a missing key_file reported with
cert_file's path), and an encrypted key made OpenSSL ask for a pass phrase on the terminal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from integration.edged_daemon import daemon_environment
from test_mqtt_security import make_pki, openssl

from edged.config import MqttConfig
from edged.errors import ConfigKeyError
from edged.mqtt._settings import connection_settings
from edged.mqtt._tls import tls_context


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    make_pki(d)
    openssl("pkey", "-in", "client.key", "-aes256", "-passout", "pass:secret", "-out", "encrypted.key", cwd=d)
    (d / "folder").mkdir()
    return d


CASES = [
    ({"ca_file": "missing.crt"}, "mqtt.ca_file", "cannot read {d}/missing.crt: No such file or directory"),
    ({"ca_file": "folder"}, "mqtt.ca_file", "cannot read {d}/folder: Is a directory"),
    ({"ca_file": "client.key"}, "mqtt.ca_file", "{d}/client.key holds no CA certificate edged can use"),
    ({"cert_file": "missing.crt", "key_file": "client.key"}, "mqtt.cert_file",
     "cannot read {d}/missing.crt: No such file or directory"),
    ({"cert_file": "client.key", "key_file": "client.key"}, "mqtt.cert_file",
     "{d}/client.key holds no PEM certificate"),
    ({"cert_file": "client.crt", "key_file": "missing.key"}, "mqtt.key_file",
     "cannot read {d}/missing.key: No such file or directory"),
    ({"cert_file": "client.crt", "key_file": "folder"}, "mqtt.key_file", "cannot read {d}/folder: Is a directory"),
    ({"cert_file": "client.crt", "key_file": "ca.crt"}, "mqtt.key_file", "{d}/ca.crt holds no PEM private key"),
    ({"cert_file": "client.crt", "key_file": "server.key"}, "mqtt.key_file",
     "{d}/server.key is not the private key of the certificate in cert_file {d}/client.crt"),
    ({"cert_file": "client.crt", "key_file": "encrypted.key"}, "mqtt.key_file",
     "{d}/encrypted.key holds an encrypted private key, and edged has no way to take its pass phrase"),
    ({"cert_file": "client.crt"}, "mqtt.cert_file", "{d}/client.crt holds no PEM private key"),  # key in the cert
    ({"key_file": "client.key"}, "mqtt.key_file", "{d}/client.key is set without cert_file"),  # it was ignored
]


@pytest.mark.parametrize(("files", "key", "problem"), CASES, ids=[
    "ca-missing", "ca-folder", "ca-not-a-certificate", "cert-missing", "cert-not-a-certificate", "key-missing",
    "key-folder", "key-not-a-key", "key-of-another-certificate", "key-encrypted", "cert-without-its-key",
    "key-without-its-cert"])
def test_each_unusable_tls_file_is_named_with_its_key(pki: Path, files: dict[str, str], key: str,
                                                      problem: str) -> None:
    named = {"ca_file": "ca.crt", **files}
    config = MqttConfig(broker="mqtts://127.0.0.1:8883", **{name: str(pki / file) for name, file in named.items()})
    with pytest.raises(ConfigKeyError) as refused:
        tls_context(connection_settings(config, {}))
    section, name = key.split(".")
    assert refused.value.key == key
    assert str(refused.value).startswith(f"[{section}] {name}: {problem.format(d=pki)}"), str(refused.value)


def test_usable_tls_files_make_a_context_that_checks_the_broker(pki: Path) -> None:
    config = MqttConfig(broker="mqtts://127.0.0.1:8883", ca_file=str(pki / "ca.crt"),
                        cert_file=str(pki / "client.crt"), key_file=str(pki / "client.key"))
    context = tls_context(connection_settings(config, {}))
    assert context.check_hostname and context.get_ca_certs()[0]["subject"] == ((("commonName", "test-ca"),),)


def _serve(tmp_path: Path, config: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "models").mkdir(exist_ok=True)
    path = tmp_path / "edged.toml"
    path.write_text(f'[telemetry]\nsource = "off"\n[models]\nrepository = "{tmp_path / "models"}"\n{config}')
    return subprocess.run([sys.executable, "-m", "edged", "serve", "--config", str(path), "--socket",
                           str(tmp_path / "s.sock"), "--state-dir", str(tmp_path / "state"), *args],
                          capture_output=True, text=True, timeout=120, env=daemon_environment(), check=False,
                          stdin=subprocess.DEVNULL, start_new_session=True)  # no terminal to ask a pass phrase on


def test_serve_names_the_config_file_and_the_key_of_an_encrypted_key(pki: Path, tmp_path: Path) -> None:
    done = _serve(tmp_path, f'[mqtt]\nbroker = "mqtts://127.0.0.1:1"\ncert_file = "{pki / "client.crt"}"\n'
                  f'key_file = "{pki / "encrypted.key"}"\n')
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"edged serve: error: {tmp_path / 'edged.toml'}: [mqtt] key_file: {pki / 'encrypted.key'} holds an "
        "encrypted private key, and edged has no way to take its pass phrase: store the key decrypted (openssl pkey "
        "-in KEY -out PLAIN_KEY), readable by edged's user only"], done.stderr


def test_serve_names_the_flag_when_the_value_came_from_one(tmp_path: Path) -> None:
    done = _serve(tmp_path, "", "--mqtt-broker", "mqtt://127.0.0.1:1883/path")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        "edged serve: error: --mqtt-broker: 'mqtt://127.0.0.1:1883/path' has a path, query or fragment, which MQTT "
        "over TCP has no use for; expected mqtt://host:port or mqtts://host:port"], done.stderr

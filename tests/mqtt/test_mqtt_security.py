"""TLS (CA, client certificate) and username/password against a real mosquitto configured to require them."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from pathlib import Path

import orjson
import paho.mqtt.client as paho
import pytest
from conftest import MOSQUITTO, free_port, wait_until
from paho.mqtt.enums import CallbackAPIVersion
from test_mqtt_outbox import frame

from edged.config import MqttConfig, PipelineConfig
from edged.engine import InferenceService
from edged.mqtt import MqttFrontEnd

STREAM = 300  # a few 16 KiB TLS records' worth of PUBLISH and PUBACK packets


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(d: Path) -> None:
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
            "-keyout", "ca.key", "-out", "ca.crt", cwd=d)
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={'localhost' if name == 'server' else name}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
        (d / f"{name}.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=d)


def start_mosquitto(conf: Path, port: int) -> subprocess.Popen[bytes]:
    if os.geteuid() == 0:  # as root mosquitto drops to user mosquitto, who cannot read pytest's tmp dirs
        conf.write_text(conf.read_text() + "user root\n")
    process = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def listening() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"mosquitto exited: {process.stderr.read() if process.stderr else b''!r}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return True
        except OSError:
            return False

    wait_until(listening, what="mosquitto listening")
    return process


def test_tls_with_client_certificate_carries_a_qos1_stream(service: InferenceService, tmp_path: Path) -> None:
    """Over TLS the buffered socket under paho reads decrypted records (ssl pending() included): every result
    of a stream comes back."""
    make_pki(tmp_path)
    port = free_port()
    conf = tmp_path / "m.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\ncafile {tmp_path}/ca.crt\n"
                    f"certfile {tmp_path}/server.crt\nkeyfile {tmp_path}/server.key\nrequire_certificate true\n"
                    "max_queued_messages 0\n")
    broker = start_mosquitto(conf, port)
    sensor = paho.Client(CallbackAPIVersion.VERSION2, client_id="tls-sensor")
    results: list[bytes] = []
    try:
        fe = MqttFrontEnd(service, MqttConfig(
            broker=f"mqtts://127.0.0.1:{port}", device_id="tls1", ca_file=str(tmp_path / "ca.crt"),
            cert_file=str(tmp_path / "client.crt"), key_file=str(tmp_path / "client.key"),
            pipelines=(PipelineConfig(input="tls/+/in", model="tiny_mlp", output="tls/{1}/out", qos=1),)),
            tmp_path / "s", version="1")
        fe.start()
        wait_until(lambda: fe.status()["connected"], what="TLS connection")
        assert fe.status()["tls"] is True
        sensor.tls_set(ca_certs=str(tmp_path / "ca.crt"), certfile=str(tmp_path / "client.crt"),
                       keyfile=str(tmp_path / "client.key"))
        sensor.on_message = lambda client, userdata, msg: results.append(msg.payload)
        subscribed = threading.Event()
        sensor.on_subscribe = lambda *args: subscribed.set()
        sensor.connect("127.0.0.1", port)
        sensor.loop_start()
        sensor.subscribe("tls/+/out", 1)
        assert subscribed.wait(30)
        for i in range(STREAM):
            sensor.publish(f"tls/s{i % 2}/in", frame(i), 1)
        wait_until(lambda: len(results) >= STREAM, 120, f"{STREAM} results over TLS")
        assert {orjson.loads(r)["id"] for r in results} == {f"m-{i}" for i in range(STREAM)}
        fe.stop(5)
    finally:
        sensor.loop_stop()
        broker.terminate()
        broker.wait(5)


@pytest.mark.parametrize(("password", "connects"), [("right", True), ("wrong", False)])
def test_username_and_password_file(service: InferenceService, tmp_path: Path, password: str,
                                    connects: bool) -> None:
    port = free_port()
    passwords = tmp_path / "passwd"
    passwords.write_text("")
    subprocess.run(["mosquitto_passwd", "-b", str(passwords), "edge", "right"], check=True)
    conf = tmp_path / "m.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous false\npassword_file {passwords}\n")
    broker = start_mosquitto(conf, port)
    (tmp_path / "pw").write_text(password + "\n")
    try:
        fe = MqttFrontEnd(service, MqttConfig(broker=f"mqtt://127.0.0.1:{port}", device_id="auth1",
                                              username="edge", password_file=str(tmp_path / "pw"),
                                              reconnect_min_s=0.05, reconnect_max_s=0.2),
                          tmp_path / "s", version="1")
        fe.start()
        if connects:
            wait_until(lambda: fe.status()["connected"], what="authenticated connection")
        else:
            wait_until(lambda: "refused" in fe.status()["last_error"], what="refusal reported")
            assert fe.status()["connected"] is False
        fe.stop(2)
    finally:
        broker.terminate()
        broker.wait(5)

"""Status topic (birth, will, stopped), connection state, settings, and serving while the broker is down."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import orjson
import paho.mqtt.client as paho
import pytest
from conftest import Broker, Subscriber, free_port, wait_until

from edged.config import MqttConfig, parse_config
from edged.engine import InferenceService
from edged.errors import ConfigError, PayloadError
from edged.mqtt import MqttFrontEnd
from edged.mqtt._paho import backoff_delay
from edged.mqtt._settings import connection_settings, parse_broker, read_password
from edged.mqtt._topics import check_filter, check_template, filter_matches, parse_infer_topic, render


def status_payloads(sub: Subscriber) -> list[dict]:
    return [orjson.loads(m.payload) for m in list(sub.messages)]


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_birth_on_every_connect_and_stopped_on_clean_stop(service: InferenceService, broker: Broker,
                                                          tmp_path: Path, protocol: str) -> None:
    sub = Subscriber(broker.port, ["edged/dev5/status"])
    fe = MqttFrontEnd(service, MqttConfig(broker=broker.url, device_id="dev5", protocol=protocol,  # type: ignore[arg-type]
                                          reconnect_min_s=0.05, reconnect_max_s=0.2), tmp_path, version="9.9")
    fe.start()
    wait_until(lambda: any(d["state"] == "online" for d in status_payloads(sub)), what="birth")
    birth = next(d for d in status_payloads(sub) if d["state"] == "online")
    assert birth["version"] == "9.9" and "digits_onnx" in birth["models"]
    assert birth["capabilities"]["protocol"] == protocol
    broker.stop(signal.SIGTERM)
    broker.start()
    wait_until(lambda: sum(d["state"] == "online" for d in status_payloads(sub)) >= 2, what="second birth")
    fe.stop(5)
    wait_until(lambda: status_payloads(sub)[-1]["state"] == "stopped", what="stopped")
    late = Subscriber(broker.port, ["edged/dev5/status"])  # retained: a newcomer sees "stopped"
    assert orjson.loads(late.wait_for(1)[0].payload)["state"] == "stopped"
    late.close()
    sub.close()


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_subscribed_follows_the_suback_and_a_request_sent_then_is_answered(service: InferenceService, broker: Broker,
                                                                           tmp_path: Path, protocol: str) -> None:
    """`subscribed` in the status means the broker has the subscriptions: a request published from then on is
    answered (after only `connected` it could still miss the subscription and be lost); it is false again while
    the broker is away."""
    fe = MqttFrontEnd(service, MqttConfig(broker=broker.url, device_id="dev8", protocol=protocol,  # type: ignore[arg-type]
                                          reconnect_min_s=0.05, reconnect_max_s=0.2), tmp_path, version="1")
    assert fe.status()["subscribed"] is False
    fe.start()
    replies = Subscriber(broker.port, ["replies/dev8"])
    try:
        wait_until(lambda: fe.status()["subscribed"], what="subscribed")
        assert fe.status()["connected"] is True
        body = orjson.dumps({"reply_to": "replies/dev8", "inputs": [
            {"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]})
        publisher = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="dev8-pub")
        publisher.connect("127.0.0.1", broker.port)
        publisher.loop_start()
        publisher.publish("edged/dev8/infer/tiny_mlp", body, 1).wait_for_publish(10)
        publisher.loop_stop()
        assert replies.wait_for(1), "the request sent once subscribed was not answered"
        broker.stop(signal.SIGKILL)
        wait_until(lambda: not fe.status()["subscribed"], what="not subscribed with the broker gone")
    finally:
        replies.close()
        fe.stop(2)


def test_last_will_says_offline_when_edged_vanishes(service: InferenceService, broker: Broker,
                                                    tmp_path: Path) -> None:
    sub = Subscriber(broker.port, ["edged/dev6/status"])
    fe = MqttFrontEnd(service, MqttConfig(broker=broker.url, device_id="dev6", keepalive_s=1), tmp_path,
                      version="1")
    fe.start()
    wait_until(lambda: fe.status()["connected"], what="connected")
    sock = fe._connection._client.socket()
    sock.shutdown(socket.SHUT_RDWR)
    wait_until(lambda: any(d["state"] == "offline" for d in status_payloads(sub)), 10, "last will")
    fe.stop(2)
    sub.close()


def test_start_never_raises_without_broker_and_connects_when_it_appears(service: InferenceService,
                                                                        tmp_path: Path) -> None:
    broker = Broker(tmp_path / "late-broker")
    fe = MqttFrontEnd(service, MqttConfig(broker=broker.url, device_id="dev7", reconnect_min_s=0.05,
                                          reconnect_max_s=0.2), tmp_path / "state", version="1")
    fe.start()
    fe.publish_telemetry(b'{"power_w": 3.2}')
    wait_until(lambda: fe.status()["outbox"]["depth"] == 1, what="telemetry stored")
    wait_until(lambda: "cannot connect" in fe.status()["last_error"], what="the refusal reported")
    assert fe.status()["connected"] is False
    assert "edged_mqtt_connected 0" in fe.prometheus_lines()
    assert "edged_mqtt_outbox_messages 1" in fe.prometheus_lines()
    broker.start()
    try:
        sub = Subscriber(broker.port, ["edged/dev7/telemetry"])
        wait_until(lambda: fe.status()["connected"], what="connected once the broker is up")
        wait_until(lambda: fe.status()["outbox"]["depth"] == 0, what="outbox delivered")
        fe.stop(5)
        sub.close()
    finally:
        broker.stop()


def test_settings_password_from_file_or_systemd_credential(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("s3cret\n")
    assert read_password(MqttConfig(password_file=str(tmp_path / "pw")), {}) == "s3cret"
    (tmp_path / "creds").mkdir()
    (tmp_path / "creds" / "mqtt-password").write_text("fromsystemd")
    assert read_password(MqttConfig(), {"CREDENTIALS_DIRECTORY": str(tmp_path / "creds")}) == "fromsystemd"
    assert read_password(MqttConfig(), {}) is None
    with pytest.raises(ConfigError, match="does not exist"):
        read_password(MqttConfig(password_file=str(tmp_path / "missing")), {})
    (tmp_path / "latin1").write_bytes(b"s3cr\xe9t\n")
    with pytest.raises(ConfigError) as refused:
        read_password(MqttConfig(password_file=str(tmp_path / "latin1")), {})
    assert str(refused.value) == (f"[mqtt] password_file: {tmp_path / 'latin1'} is not UTF-8 text (byte 4); save "
                                  "it as UTF-8")
    assert refused.value.__context__ is None and refused.value.__cause__ is None  # nothing carries the password
    # a file that cannot be read is named by its key, or as the systemd credential it was
    with pytest.raises(ConfigError) as unreadable:
        read_password(MqttConfig(password_file=str(tmp_path / "creds")), {})
    assert str(unreadable.value) == (f"[mqtt] password_file: cannot read {tmp_path / 'creds'}: Is a directory; the "
                                     "file must be readable by edged's user")
    (tmp_path / "creds" / "mqtt-password").unlink()
    (tmp_path / "creds" / "mqtt-password").mkdir()
    with pytest.raises(ConfigError) as credential:
        read_password(MqttConfig(), {"CREDENTIALS_DIRECTORY": str(tmp_path / "creds")})
    assert str(credential.value) == (f"systemd credential mqtt-password: cannot read {tmp_path / 'creds'}/"
                                     "mqtt-password: Is a directory; the file must be readable by edged's user")
    settings = connection_settings(MqttConfig(broker="mqtts://broker.local", device_id="cam 1/x#"), {})
    assert (settings.host, settings.port, settings.tls) == ("broker.local", 8883, True)
    assert settings.client_id == "edged-cam_1_x_"
    assert parse_broker("10.0.0.2:1884") == ("10.0.0.2", 1884, False)
    with pytest.raises(ConfigError):
        parse_broker("http://x")



@pytest.mark.parametrize(("url", "words"), [
    ("mqtt://user:secretpw@127.0.0.1:1883", "set [mqtt] username and password_file"),
    ("http://user:secretpw@x", "set [mqtt] username and password_file"),
    ("mqtt://127.0.0.1:1883/foo", "has a path, query or fragment"),
    ("mqtt://127.0.0.1:1883?x=1", "has a path, query or fragment"),
], ids=["credentials", "credentials-bad-scheme", "path", "query"])
def test_a_broker_url_with_credentials_or_a_path_is_refused_without_quoting_a_secret(url: str, words: str) -> None:
    """Review: credentials in the URL were ignored (the client connected anonymously) and a path accepted."""
    with pytest.raises(ConfigError, match=r"^\[mqtt\] broker: ") as refused:
        parse_broker(url)
    assert words in str(refused.value) and "secretpw" not in str(refused.value)


def test_config_file_pipelines_parse() -> None:
    config = parse_config("""
[mqtt]
broker = "mqtt://localhost:1883"
protocol = "3.1.1"
[mqtt.outbox]
fsync = "off"
[[mqtt.pipelines]]
input = "sensors/+/frame"
model = "digits_onnx"
output = "results/{1}/digits"
postprocess = "topk"
backpressure = "drop_oldest"
""")
    assert config.mqtt.pipelines[0].postprocess == "topk" and config.mqtt.outbox.fsync == "off"


def test_backoff_has_jitter_and_bounds() -> None:
    import random

    rng = random.Random(1)
    delays = [backoff_delay(attempt, 0.5, 30.0, rng) for attempt in range(12)]
    assert all(0.5 <= d <= 30.0 for d in delays)
    assert len({round(d, 6) for d in delays}) == len(delays)


def test_topic_filters_templates_and_hostile_topics() -> None:
    assert filter_matches("sensors/+/frame", "sensors/a/frame") == ("a",)
    assert filter_matches("sensors/+/frame", "sensors/a/b/frame") is None
    assert filter_matches("raw/#", "raw/a/b") == ("a/b",)
    assert filter_matches("+/x", "$SYS/x") is None
    assert render("out/{2}/{1}", ("a", "b")) == "out/b/a"
    with pytest.raises(PayloadError):
        check_filter("a/b#")
    with pytest.raises(PayloadError):
        check_template("out/{3}", 2)
    with pytest.raises(PayloadError):
        render("$SYS/{1}", ("x",))
    assert parse_infer_topic("edged/d", "edged/d/infer/m") == ("m", "")
    assert parse_infer_topic("edged/d", "edged/d/infer/m/3") == ("m", "3")
    assert parse_infer_topic("edged/d", "edged/d/status") is None
    for bad in ("edged/d/infer/..", "edged/d/infer/m/1/2", "edged/d/infer/m/x", "edged/d/infer/",
                "edged/d/infer/a b"):
        with pytest.raises(PayloadError):
            parse_infer_topic("edged/d", bad)


def test_mqtt311_front_end_keeps_a_persistent_session(service: InferenceService, broker: Broker,
                                                      tmp_path: Path) -> None:
    """Requests published while edged is away wait in its broker session and are answered on return."""
    config = MqttConfig(broker=broker.url, device_id="dev8", protocol="3.1.1", reconnect_min_s=0.05)
    fe = MqttFrontEnd(service, config, tmp_path / "s", version="1")
    fe.start()
    wait_until(lambda: fe.status()["connected"], what="connected")
    fe.stop(5)
    sub = Subscriber(broker.port, ["replies/dev8"], protocol=paho.MQTTv311)
    doc = {"reply_to": "replies/dev8", "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64],
                                                   "data": [0.5] * 64}]}
    sub.client.publish("edged/dev8/infer/tiny_mlp", orjson.dumps(doc), 1).wait_for_publish(5)
    time.sleep(0.05)
    fe = MqttFrontEnd(service, config, tmp_path / "s", version="1")
    fe.start()
    assert "outputs" in orjson.loads(sub.wait_for(1)[0].payload)
    fe.stop(5)
    sub.close()
    assert free_port() > 0

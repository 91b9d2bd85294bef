"""Request/response over real mosquitto: MQTT v5 and 3.1.1, JSON, binary, raw and image payloads, errors."""

from __future__ import annotations

import io
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import paho.mqtt.client as paho
import pytest
from conftest import Broker, Subscriber, wait_until
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from PIL import Image

from edged.config import MqttConfig, PipelineConfig
from edged.engine import InferenceService, InferRequest
from edged.mqtt import MqttFrontEnd
from edged.protocol import decode_response, encode_request

PIXELS = np.linspace(0, 1, 64, dtype=np.float32).reshape(1, 64)


@pytest.fixture
def front(service: InferenceService, broker: Broker, tmp_path: Path) -> Iterator[MqttFrontEnd]:
    config = MqttConfig(broker=broker.url, device_id="dev1", max_payload_bytes=64 * 1024)
    fe = MqttFrontEnd(service, config, tmp_path / "state", version="test")
    fe.start()
    # The front end subscribes before it publishes its retained birth: once the birth arrives, its SUBSCRIBE was
    # processed, and a request published now reaches it (before, on a loaded machine a request could beat it).
    birth = Subscriber(broker.port, ["edged/dev1/status"])
    try:
        birth.wait_for(1, timeout_s=60)
    finally:
        birth.close()
    yield fe
    fe.stop(5)


class Requester(Subscriber):
    """Sends v5 requests with a ResponseTopic and CorrelationData and waits for the matching reply."""

    def __init__(self, port: int) -> None:
        self.reply_topic = f"replies/{uuid.uuid4().hex}"
        super().__init__(port, [self.reply_topic])
        wait_subscribed(self)

    def request(self, topic: str, payload: bytes, content_type: str | None = None,
                user: list[tuple[str, str]] | None = None, qos: int = 1) -> paho.MQTTMessage:
        correlation = uuid.uuid4().bytes
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = self.reply_topic
        props.CorrelationData = correlation
        if content_type:
            props.ContentType = content_type
        if user:
            props.UserProperty = user
        self.client.publish(topic, payload, qos, properties=props)
        deadline = time.monotonic() + 10
        with self.cond:
            while time.monotonic() < deadline:
                for msg in self.messages:
                    if msg.properties.CorrelationData == correlation:
                        return msg
                self.cond.wait(0.1)
        raise AssertionError(f"no reply for a request on {topic}")


def wait_subscribed(client: Subscriber) -> None:
    """A round trip through the broker proves our SUBSCRIBE was processed (packets are handled in order)."""
    probe = client.topics[0]
    client.client.publish(probe, b"probe", 1)
    client.wait_for(1)
    with client.cond:
        client.messages.clear()


def expected_output() -> np.ndarray:
    return np.asarray(EXPECTED["output"])


EXPECTED: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def _expected(service: InferenceService) -> None:
    EXPECTED["output"] = service.infer(InferRequest("digits_onnx", {"input": PIXELS})).outputs["output"]


def test_v5_json_request_gets_kserve_reply_with_correlation(front: MqttFrontEnd, broker: Broker) -> None:
    client = Requester(broker.port)
    body, _ = encode_request({"input": PIXELS}, binary=False, request_id="r-1")
    reply = client.request("edged/dev1/infer/digits_onnx", body, "application/json")
    doc = orjson.loads(reply.payload)
    assert doc["id"] == "r-1" and doc["model_name"] == "digits_onnx"
    np.testing.assert_allclose(np.asarray(doc["outputs"][0]["data"]).reshape(1, 10), expected_output(), rtol=1e-5)
    assert doc["parameters"]["edged_message_id"]
    client.close()


def test_v5_binary_request_gets_binary_reply(front: MqttFrontEnd, broker: Broker) -> None:
    client = Requester(broker.port)
    body, length = encode_request({"input": PIXELS}, binary=True)
    reply = client.request("edged/dev1/infer/digits_onnx/1", body, "application/octet-stream",
                           [("Inference-Header-Content-Length", str(length))])
    header = dict(reply.properties.UserProperty)["Inference-Header-Content-Length"]
    _, outputs = decode_response(reply.payload, int(header))
    np.testing.assert_allclose(outputs["output"], expected_output(), rtol=1e-5)
    client.close()


def test_v5_raw_tensor_with_shape_in_user_properties(front: MqttFrontEnd, broker: Broker) -> None:
    client = Requester(broker.port)
    reply = client.request("edged/dev1/infer/digits_onnx", PIXELS.tobytes(), "application/octet-stream",
                           [("datatype", "FP32"), ("shape", "1,64")])
    doc = orjson.loads(reply.payload)
    np.testing.assert_allclose(np.asarray(doc["outputs"][0]["data"]).reshape(1, 10), expected_output(), rtol=1e-5)
    client.close()


def test_v5_png_image_is_preprocessed_as_the_model_declares(front: MqttFrontEnd, broker: Broker) -> None:
    client = Requester(broker.port)
    image = Image.fromarray((PIXELS.reshape(8, 8) * 255).round().astype(np.uint8), mode="L")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    reply = client.request("edged/dev1/infer/digits_onnx", buffer.getvalue(), "image/png")
    doc = orjson.loads(reply.payload)
    np.testing.assert_allclose(np.asarray(doc["outputs"][0]["data"]).reshape(1, 10), expected_output(), atol=1e-2)
    client.close()


def test_mqtt311_reply_goes_to_reply_to_in_payload(front: MqttFrontEnd, broker: Broker) -> None:
    reply_topic = f"replies311/{uuid.uuid4().hex}"
    client = Subscriber(broker.port, [reply_topic], protocol=paho.MQTTv311)
    wait_subscribed(client)
    doc = {"id": "old-1", "reply_to": reply_topic,
           "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": PIXELS.ravel().tolist()}]}
    client.client.publish("edged/dev1/infer/digits_onnx", orjson.dumps(doc), 1)
    reply = orjson.loads(client.wait_for(1)[0].payload)
    assert reply["id"] == "old-1"
    np.testing.assert_allclose(np.asarray(reply["outputs"][0]["data"]).reshape(1, 10), expected_output(), rtol=1e-5)
    client.close()


def test_mqtt311_reply_is_json_even_when_binary_outputs_are_asked(front: MqttFrontEnd, broker: Broker) -> None:
    """A 3.1.1 subscriber never sees user properties. Before, `binary_data: true` sent it KServe's binary framing
    with the JSON header's length only in the user property Inference-Header-Content-Length: a blob it could
    not split."""
    reply_topic = f"replies311/{uuid.uuid4().hex}"
    client = Subscriber(broker.port, [reply_topic], protocol=paho.MQTTv311)
    wait_subscribed(client)
    doc = {"id": "old-2", "reply_to": reply_topic, "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
           "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": PIXELS.ravel().tolist()}]}
    client.client.publish("edged/dev1/infer/digits_onnx", orjson.dumps(doc), 1)
    reply = orjson.loads(client.wait_for(1)[0].payload)
    client.close()
    np.testing.assert_allclose(np.asarray(reply["outputs"][0]["data"]).reshape(1, 10), expected_output(), rtol=1e-5)


@pytest.mark.parametrize(("topic", "payload", "expected"), [
    ("edged/dev1/infer/no_such_model", b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 1], '
     b'"data": [1]}]}', "no_such_model"),
    ("edged/dev1/infer/digits_onnx", b"{not json", "not valid JSON"),
    ("edged/dev1/infer/digits_onnx", b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3], '
     b'"data": [1, 2, 3]}]}', "input"),
    ("edged/dev1/infer/digits_onnx/x%2f..", b"{}", "version must be a number"),
    ("edged/dev1/infer/digits_onnx", b"x" * (65 * 1024), "more than the limit"),
])
def test_errors_come_back_as_error_json(front: MqttFrontEnd, broker: Broker, topic: str, payload: bytes,
                                        expected: str) -> None:
    client = Requester(broker.port)
    reply = client.request(topic, payload, "application/json")
    doc = orjson.loads(reply.payload)
    assert expected in doc["error"], doc
    assert front.status()["errors"]
    # every error result carries edged's parameters, a refusal of the topic itself too (a review found those bare)
    assert doc["parameters"]["edged_message_id"] == dict(reply.properties.UserProperty)["edged-message-id"]
    assert isinstance(doc["parameters"]["input_timestamp"], float)
    client.close()


@pytest.mark.parametrize(("user", "payload", "expected"), [
    ([("datatype", "FP32"), ("shape", "1,6\u00b2")], PIXELS.tobytes(), "user property shape must be numbers"),
    ([("datatype", "FP32"), ("shape", "\u0661,64")], PIXELS.tobytes(), "user property shape must be numbers"),
    ([("datatype", "FP32"), ("shape", "4294967296,4294967296")], b"", "more than the limit"),
    ([("datatype", "FP32"), ("shape", "9223372036854775807,2")], b"", "more than the limit"),
    ([("datatype", "FP32"), ("shape", "99999999999999999999999,64")], b"", "user property shape must be numbers"),
    ([("Inference-Header-Content-Length", "\u00b2")], PIXELS.tobytes(), "must be a number"),
], ids=["superscript", "arabic-digit", "wraps-to-zero", "wraps-negative", "past-int64", "header-superscript"])
def test_raw_and_binary_user_properties_are_ascii_numbers_within_the_limit(
        front: MqttFrontEnd, broker: Broker, user: list[tuple[str, str]], payload: bytes, expected: str) -> None:
    """A shape whose element count passes 2**63 wrapped in int64 (0 elements matched an empty payload, then a
    numpy reshape error; a negative count asked for -8 bytes), and str.isdigit let '\u00b2' through to int()."""
    client = Requester(broker.port)
    doc = orjson.loads(client.request("edged/dev1/infer/digits_onnx", payload, "application/octet-stream",
                                      user).payload)
    client.close()
    assert expected in doc.get("error", ""), doc


def test_v5_packets_far_over_max_payload_bytes_are_never_sent_to_edged(front: MqttFrontEnd,
                                                                     broker: Broker) -> None:
    """edged gives the broker its MQTT v5 Maximum Packet Size (max_payload_bytes plus room for the topic and
    properties). Before, a 256 MB publish on any input topic was read whole (three copies of it at once, RSS up
    by the payload for good after the error reply), however small max_payload_bytes was."""
    client = Requester(broker.port)
    body, _ = encode_request({"input": PIXELS}, binary=False)
    near = client.request("edged/dev1/infer/digits_onnx", b"x" * (65 * 1024), "application/json")
    assert "more than the limit" in orjson.loads(near.payload)["error"]  # just over: still answered
    received = front.status()["messages_in"]
    props = Properties(PacketTypes.PUBLISH)
    props.ResponseTopic = client.reply_topic
    props.CorrelationData = b"far over"
    client.client.publish("edged/dev1/infer/digits_onnx", b"x" * (8 * 1024 * 1024), 1, properties=props)
    reply = client.request("edged/dev1/infer/digits_onnx", body, "application/json")  # after it, in order
    assert "outputs" in orjson.loads(reply.payload)
    assert front.status()["messages_in"] == received + 1, "the 8 MiB packet reached edged"
    client.close()


@pytest.mark.parametrize(("user", "expected"), [
    ([("timestamp", "42")], 42), ([("timestamp", "1732890000.5")], 1732890000.5),
    ([("timestamp", "1796188299260977933")], 1796188299260977933), ([("timestamp", "tuesday")], "tuesday"),
], ids=["integer", "seconds", "nanoseconds", "text"])
def test_input_timestamp_is_the_callers_number_else_the_receive_time_in_seconds(
        front: MqttFrontEnd, broker: Broker, user: list[tuple[str, str]], expected: object) -> None:
    """Review: a user property came back as a string and the receive time as integer nanoseconds, while the
    README's example (and parameters.timestamp) are seconds."""
    client = Requester(broker.port)
    body, _ = encode_request({"input": PIXELS}, binary=False)
    stamped = orjson.loads(client.request("edged/dev1/infer/digits_onnx", body, "application/json", user).payload)
    before = time.time()
    plain = orjson.loads(client.request("edged/dev1/infer/digits_onnx", body, "application/json").payload)
    client.close()
    assert stamped["parameters"]["input_timestamp"] == expected
    received = plain["parameters"]["input_timestamp"]
    assert isinstance(received, float) and before - 1 < received < time.time() + 1
    assert plain["parameters"]["received_ns"] == pytest.approx(received * 1e9, abs=1e3)


def test_request_errors_use_the_engine_wording(front: MqttFrontEnd, broker: Broker,
                                               service: InferenceService) -> None:
    client = Requester(broker.port)
    body = b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}'
    reply = client.request("edged/dev1/infer/no_such_model", body, "application/json")
    try:
        service.infer(InferRequest("no_such_model", {"input": np.zeros((1, 1), np.float32)}))
    except Exception as e:
        engine_message = str(e)
    assert orjson.loads(reply.payload)["error"] == engine_message
    client.close()


def test_replies_to_edged_own_topics_or_pipeline_inputs_are_refused_and_counted(
        service: InferenceService, broker: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Review: a v5 ResponseTopic or 3.1.1 reply_to of edged/{device}/status made edged publish a result on its own
    status topic, under its own credentials (a confused deputy). Such replies are now dropped, counted bad_topic
    and logged naming the topic, as are replies onto a pipeline's input; a good request still gets its reply."""
    caplog.set_level(logging.INFO, logger="edged.mqtt")
    config = MqttConfig(broker=broker.url, device_id="own1", pipelines=(
        PipelineConfig(input="cams/+/frame", model="tiny_mlp", output="labels/{1}"),))
    front = MqttFrontEnd(service, config, tmp_path / "state", version="test")
    front.start()
    watcher = Subscriber(broker.port, ["edged/own1/#", "cams/#"])
    v311 = Subscriber(broker.port, [], protocol=paho.MQTTv311)
    requester = Requester(broker.port)
    doc = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": PIXELS.ravel().tolist()}]}
    try:
        watcher.wait_for(1, timeout_s=30)  # the retained birth: edged is subscribed
        for topic in ("edged/own1/status", "edged/own1/ota/status", "cams/x/frame"):
            props = Properties(PacketTypes.PUBLISH)
            props.ResponseTopic, props.CorrelationData = topic, b"c"
            requester.client.publish("edged/own1/infer/tiny_mlp", orjson.dumps(doc), 1, properties=props)
        v311.client.publish("edged/own1/infer/tiny_mlp", orjson.dumps({**doc, "reply_to": "edged/own1/telemetry"}), 1)
        good = requester.request("edged/own1/infer/tiny_mlp", orjson.dumps(doc))  # after them: they were handled
        wait_until(lambda: front.status()["drops"].get("bad_topic", 0) == 4, what="4 refused reply topics counted")
    finally:
        requester.close()
        v311.close()
        front.stop(5)
        watcher.close()
    assert "outputs" in orjson.loads(good.payload)
    published = [m for m in watcher.messages if not m.topic.endswith("/status") or b'"state"' not in m.payload]
    assert [(m.topic, m.payload[:60]) for m in published if m.topic != "edged/own1/infer/tiny_mlp"] == []
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "'edged/own1/status' is under edged's own topics" in logged and "pipeline input 'cams/+/frame'" in logged


@pytest.mark.parametrize("bad", ["\u0001", "\u001f", "\u007f", "\u0085", "\ufdd0", "\ufffe", "\U0001ffff"],
                         ids=["soh", "us", "del", "nel", "fdd0", "fffe", "1ffff"])
def test_a_reply_to_with_characters_brokers_refuse_is_dropped_and_the_connection_stays(
        front: MqttFrontEnd, broker: Broker, bad: str) -> None:
    """JSON carries any character in "reply_to", and mosquitto closes a connection that publishes a topic with a
    control character or a noncharacter ("malformed packet"; MQTT 1.5.4 allows it to). Before, edged stored
    such a reply in its outbox and sent it: mosquitto dropped edged, edged reconnected and sent it again, for
    good (kill -9 and restart included: it was in the outbox), and no result or request got through."""
    v311 = Subscriber(broker.port, [], protocol=paho.MQTTv311)
    requester = Requester(broker.port)
    doc = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": PIXELS.ravel().tolist()}]}
    try:
        v311.client.publish("edged/dev1/infer/digits_onnx", orjson.dumps({**doc, "reply_to": f"replies/a{bad}b"}), 1)
        good = requester.request("edged/dev1/infer/digits_onnx", orjson.dumps(doc))
        wait_until(lambda: front.status()["drops"].get("bad_topic", 0) == 1, what="the reply topic refused")
        assert "outputs" in orjson.loads(good.payload)
        assert front.status()["connects"] == 1
    finally:
        requester.close()
        v311.close()


def test_a_backlog_of_qos1_requests_after_a_restart_is_served_not_refused(
        service: InferenceService, broker: Broker, tmp_path: Path) -> None:
    """Requests published while edged was down wait in its persistent session; at the next connect the broker
    may send all of them at once (mosquitto 2.0.11 does past any Receive Maximum after a kill -9). Before, the
    request queue (64 per worker) answered the oldest past it 'the MQTT request queue is full; try again later'
    and acknowledged them: a third of a 600-request backlog refused after one restart."""
    config = MqttConfig(broker=broker.url, device_id="backlog", request_workers=1)
    front = MqttFrontEnd(service, config, tmp_path / "state", version="test")
    front.start()
    wait_until(lambda: front.status()["subscribed"], what="subscribed")
    front.stop(5)  # the session (and its subscription) stays at the broker
    client = Requester(broker.port)
    body, _ = encode_request({"input": PIXELS}, binary=False)
    props = Properties(PacketTypes.PUBLISH)
    props.ResponseTopic = client.reply_topic
    count = 1500
    for _ in range(count):
        client.client.publish("edged/backlog/infer/digits_onnx", body, 1, properties=props)
    front = MqttFrontEnd(service, config, tmp_path / "state", version="test")
    front.start()
    try:
        replies = client.wait_for(count, timeout_s=120)
        refused = [m.payload for m in replies if b'"error"' in m.payload]
        assert len(replies) == count and not refused, (len(replies), refused[:1], front.status()["drops"])
    finally:
        client.close()
        front.stop(5)

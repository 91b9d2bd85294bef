"""Sensor pipelines over real mosquitto: wildcards, templated outputs, top-k labels, order, hostile input."""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest
from conftest import Broker, Subscriber, wait_until
from PIL import Image

from edged.config import MqttConfig, PipelineConfig
from edged.engine import InferenceService
from edged.errors import ConfigError, EdgedError
from edged.mqtt import MqttFrontEnd
from edged.protocol import encode_request


def frame(value: float, request_id: str = "", timestamp: float | None = None) -> bytes:
    params = {"timestamp": timestamp} if timestamp is not None else None
    body, _ = encode_request({"input": np.full((1, 64), value, np.float32)}, binary=False, request_id=request_id,
                             parameters=params)
    return body


@pytest.fixture
def pipelines(service: InferenceService, broker: Broker, tmp_path: Path) -> Iterator[MqttFrontEnd]:
    config = MqttConfig(broker=broker.url, device_id="dev2", max_payload_bytes=16 * 1024, pipelines=(
        PipelineConfig(input="sensors/+/frame", model="digits_onnx", output="results/{1}/digits",
                       postprocess="topk", top_k=3),
        PipelineConfig(input="cams/+/+/jpeg", model="digits_onnx", output="vision/{2}/{1}", codec="image"),
        PipelineConfig(input="raw/#", model="tiny_mlp", output="raw-out/{1}", codec="raw", qos=0),
        PipelineConfig(input="flood/+", model="tiny_mlp", output="flood-out/{1}", max_in_flight=4,
                       backpressure="drop_oldest"),
    ))
    fe = MqttFrontEnd(service, config, tmp_path / "state", version="test")
    fe.start()
    wait_until(lambda: fe.status()["connected"], what="front end connected")
    yield fe
    fe.stop(5)


def test_wildcard_topics_route_to_templated_outputs_with_topk_labels(pipelines: MqttFrontEnd,
                                                                     broker: Broker) -> None:
    sub = Subscriber(broker.port, ["results/#"])
    wait_subscribed_to(sub, "results/probe/digits")
    for sensor in ("kitchen", "garage"):
        for i in range(20):
            sub.client.publish(f"sensors/{sensor}/frame", frame(i / 20, f"{sensor}-{i}", timestamp=1000.0 + i), 1)
    messages = sub.wait_for(40)
    assert len(messages) == 40
    by_topic: dict[str, list[dict]] = {}
    for msg in messages:
        by_topic.setdefault(msg.topic, []).append(orjson.loads(msg.payload))
    assert set(by_topic) == {"results/kitchen/digits", "results/garage/digits"}
    for sensor in ("kitchen", "garage"):
        docs = by_topic[f"results/{sensor}/digits"]
        assert [d["id"] for d in docs] == [f"{sensor}-{i}" for i in range(20)]  # order of the input topic
        assert [d["parameters"]["input_timestamp"] for d in docs] == [1000.0 + i for i in range(20)]
        top = docs[0]["outputs"][0]
        assert top["datatype"] == "BYTES" and top["shape"] == [1, 3]
        score, index, label = top["data"][0].split(":")
        assert (0 <= float(score) <= 1 and label == ["zero", "one", "two", "three", "four", "five", "six",
                                                    "seven", "eight", "nine"][int(index)]) or label
    assert len({d["parameters"]["edged_message_id"] for ds in by_topic.values() for d in ds}) == 40
    sub.close()


def wait_subscribed_to(sub: Subscriber, topic: str) -> None:
    sub.client.publish(topic, b"probe", 1)
    sub.wait_for(1)
    with sub.cond:
        sub.messages.clear()


def test_two_wildcards_and_image_codec(pipelines: MqttFrontEnd, broker: Broker) -> None:
    sub = Subscriber(broker.port, ["vision/#"])
    wait_subscribed_to(sub, "vision/probe")
    image = Image.fromarray(np.full((16, 16), 128, np.uint8), mode="L")  # resized to 8x8 by the pipeline
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG")
    sub.client.publish("cams/front/door/jpeg", buffer.getvalue(), 1)
    msg = sub.wait_for(1)[0]
    assert msg.topic == "vision/door/front"
    assert orjson.loads(msg.payload)["outputs"][0]["shape"] == [1, 10]
    sub.close()


def test_hash_wildcard_captures_the_rest_and_raw_tensors_use_model_dims(pipelines: MqttFrontEnd,
                                                                        broker: Broker) -> None:
    sub = Subscriber(broker.port, ["raw-out/#"])
    wait_subscribed_to(sub, "raw-out/probe")
    sub.client.publish("raw/line/3/cell", np.ones(64, np.float32).tobytes(), 1)
    msg = sub.wait_for(1)[0]
    assert msg.topic == "raw-out/line/3/cell"
    assert orjson.loads(msg.payload)["outputs"][0]["shape"] == [1, 10]
    sub.close()


def test_bad_payloads_give_error_results_and_never_stall_other_pipelines(pipelines: MqttFrontEnd,
                                                                        broker: Broker) -> None:
    sub = Subscriber(broker.port, ["results/#", "raw-out/#"])
    wait_subscribed_to(sub, "results/probe/digits")
    bad = [b"", b"\xff\xfe", b"[]", b'{"inputs": 3}', b"x" * (17 * 1024),
           b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}',
           b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": "nope"}]}',
           b'{"inputs": [{"name": "input", "datatype": "INT8", "shape": [1, 64], "data": [' + b"1000," * 63 +
           b"1]}]}"]
    for payload in bad:
        sub.client.publish("sensors/evil/frame", payload, 1)
    sub.client.publish("raw/ok", np.ones(64, np.float32).tobytes(), 1)
    sub.client.publish("raw/short", b"\x00" * 7, 1)
    sub.client.publish("sensors/good/frame", frame(0.5, "good"), 1)
    messages = sub.wait_for(len(bad) + 3)
    evil = [orjson.loads(m.payload) for m in messages if m.topic == "results/evil/digits"]
    assert len(evil) == len(bad) and all("error" in d for d in evil)
    assert "more than the limit" in evil[4]["error"]
    good = [orjson.loads(m.payload) for m in messages if m.topic == "results/good/digits"]
    assert good[0]["id"] == "good" and "outputs" in good[0]
    raw = {m.topic: orjson.loads(m.payload) for m in messages if m.topic.startswith("raw-out/")}
    assert "outputs" in raw["raw-out/ok"] and "error" in raw["raw-out/short"]
    status = pipelines.status()
    assert status["errors"]["pipeline"] >= len(bad) + 1
    sub.close()


def test_flood_on_drop_oldest_pipeline_counts_drops_and_others_keep_flowing(pipelines: MqttFrontEnd,
                                                                           broker: Broker) -> None:
    sub = Subscriber(broker.port, ["flood-out/#", "results/#"])
    wait_subscribed_to(sub, "results/probe/digits")
    payload = frame(0.1)
    for i in range(3000):
        sub.client.publish(f"flood/{i % 3}", payload, 0)
    sub.client.publish("sensors/calm/frame", frame(0.2, "calm"), 1)
    wait_until(lambda: any(m.topic == "results/calm/digits" for m in list(sub.messages)), 20, "calm result")
    wait_until(lambda: pipelines.status()["pipelines"][3]["queued"] == 0, 20, "flood drained")
    flood = [m for m in sub.wait_for(1) if m.topic.startswith("flood-out/")]
    drops = pipelines.status()["drops"].get("backpressure", 0)
    wait_until(lambda: len([m for m in sub.messages if m.topic.startswith("flood-out/")]) + drops >= 3000 -
               10, 20, "every flood message either answered or counted")
    assert drops > 0 and len(flood) > 0
    text = pipelines.prometheus_lines()
    assert 'edged_mqtt_dropped_total{reason="backpressure"}' in text
    assert "edged_mqtt_connected 1" in text
    sub.close()


def test_requests_without_reply_topic_are_counted_not_processed(pipelines: MqttFrontEnd,
                                                                  broker: Broker) -> None:
    sub = Subscriber(broker.port, ["results/#"])
    wait_subscribed_to(sub, "results/probe/digits")
    sub.client.publish("sensors/a/b/frame", frame(0.3), 1)  # '+' matches one level only
    sub.client.publish("edged/dev2/infer/../etc/passwd", b"{}", 1)  # a bad topic and no reply topic
    sub.client.publish("edged/dev2/infer/digits_onnx", frame(0.3), 1)  # no reply topic
    wait_until(lambda: pipelines.status()["drops"].get("no_reply_topic", 0) >= 2, what="drops counted")
    assert sub.messages == []
    sub.close()


def test_qos2_pipeline_delivers_each_result_exactly_once_in_order(service: InferenceService, broker: Broker,
                                                                  tmp_path: Path) -> None:
    config = MqttConfig(broker=broker.url, device_id="dev-q2", pipelines=(
        PipelineConfig(input="exact/+/in", model="tiny_mlp", output="exact/{1}/out", qos=2),))
    fe = MqttFrontEnd(service, config, tmp_path / "state", version="test")
    fe.start()
    try:
        wait_until(lambda: fe.status()["connected"], what="front end connected")
        sub = Subscriber(broker.port, ["exact/+/out"], qos=2)
        wait_subscribed_to(sub, "exact/probe/out")
        publisher = Subscriber(broker.port, [])
        for i in range(300):
            publisher.client.publish("exact/line1/in", frame(i / 300, f"m{i}"), 2)
        messages = sub.wait_for(300, timeout_s=30)
        assert [m.qos for m in messages] == [2] * len(messages)
        ids = [orjson.loads(m.payload)["id"] for m in messages]
        assert ids == [f"m{i}" for i in range(300)], "each result once, in the order of the input topic"
        time.sleep(0.5)  # a duplicate would arrive after the 300th
        assert len(sub.messages) == 300
        publisher.close()
        sub.close()
    finally:
        fe.stop(5)


@pytest.mark.parametrize(("routes", "named"), [
    ([("loop/+", "loop/{1}")], "mqtt.pipelines[0] output 'loop/{1}' can match its own input 'loop/+'"),
    ([("a/#", "a/out/{1}")], "mqtt.pipelines[0] output 'a/out/{1}' can match its own input 'a/#'"),
    ([("in/+", "mid/{1}"), ("mid/+", "in/{1}")],
     "mqtt.pipelines[0] output 'mid/{1}' can match mqtt.pipelines[1] input 'mid/+'; "
     "mqtt.pipelines[1] output 'in/{1}' can match mqtt.pipelines[0] input 'in/+'"),
], ids=["own-input", "hash-own-input", "two-pipeline-cycle"])
def test_a_pipeline_whose_results_would_come_back_as_its_inputs_is_refused(
        service: InferenceService, tmp_path: Path, routes: list[tuple[str, str]], named: str) -> None:
    """Review: `loop/+ -> loop/{1}` was accepted and one input flooded the broker (~900 messages in 5 s)."""
    config = MqttConfig(broker="mqtt://127.0.0.1:1", device_id="loop", pipelines=tuple(
        PipelineConfig(input=i, model="tiny_mlp", output=o) for i, o in routes))
    with pytest.raises(ConfigError, match="come back as inputs") as refused:
        MqttFrontEnd(service, config, tmp_path / "state", version="test")
    assert named in str(refused.value)


@pytest.mark.parametrize(("route", "named"), [
    (("edged/own/#", "o/{1}"), "mqtt.pipelines[0].input 'edged/own/#' can match edged's own topics"),
    (("+/+/status", "o/{1}/{2}"), "mqtt.pipelines[0].input '+/+/status' can match edged's own topics"),
    (("#", "o/x"), "mqtt.pipelines[0].input '#' can match edged's own topics"),
    (("st/+", "edged/own/status"), "mqtt.pipelines[0].output 'edged/own/status' can be a topic under"),
    (("st/+", "edged/own/infer/tiny_mlp"), "mqtt.pipelines[0].output 'edged/own/infer/tiny_mlp' can be"),
    (("+/cam", "{1}/own/infer/tiny_mlp"), "mqtt.pipelines[0].output '{1}/own/infer/tiny_mlp' can be"),
], ids=["input-under-prefix", "input-wildcards", "input-hash", "output-status", "output-infer", "output-capture"])
def test_a_pipeline_reading_or_writing_edgeds_own_topics_is_refused(
        service: InferenceService, tmp_path: Path, route: tuple[str, str], named: str) -> None:
    """Review: `edged/<device>/#` as an input fed edged's own birth message to the model and answered one request
    twice; an output of `edged/<device>/status` published results as the device's status. Refused at start, as
    a reply topic there is."""
    config = MqttConfig(broker="mqtt://127.0.0.1:1", device_id="own", pipelines=(
        PipelineConfig(input=route[0], model="tiny_mlp", output=route[1]),))
    with pytest.raises(ConfigError) as refused:
        MqttFrontEnd(service, config, tmp_path / "state", version="test")
    assert named in str(refused.value)


def test_pipelines_beside_edgeds_own_topics_are_accepted(service: InferenceService, tmp_path: Path) -> None:
    config = MqttConfig(broker="mqtt://127.0.0.1:1", device_id="own", pipelines=(
        PipelineConfig(input="+/+", model="tiny_mlp", output="out/{1}/{2}"),  # two levels: no edged topic has two
        PipelineConfig(input="edged/other/x", model="tiny_mlp", output="edged/other/y"),
        PipelineConfig(input="cam/+/raw", model="tiny_mlp", output="edged-results/{1}")))
    MqttFrontEnd(service, config, tmp_path / "state", version="test")


def test_pipelines_that_chain_without_a_cycle_are_accepted(service: InferenceService, tmp_path: Path) -> None:
    config = MqttConfig(broker="mqtt://127.0.0.1:1", device_id="chain", pipelines=(
        PipelineConfig(input="cam/+/raw", model="tiny_mlp", output="cam/{1}/feature"),
        PipelineConfig(input="cam/+/feature", model="tiny_mlp", output="cam/{1}/label"),
        PipelineConfig(input="x/#", model="tiny_mlp", output="y/{1}")))
    MqttFrontEnd(service, config, tmp_path / "state", version="test")


def test_a_pipeline_naming_a_missing_model_warns_at_start_and_counts_each_input(
        service: InferenceService, broker: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Review: a pipeline naming a model that does not exist started without a word. The model may be loaded later,
    so it starts, says so, and answers each input with an error result counted as model_missing."""
    config = MqttConfig(broker=broker.url, device_id="nomodel", pipelines=(
        PipelineConfig(input="nm/+/in", model="no_such_model", output="nm/{1}/out"),))
    front = MqttFrontEnd(service, config, tmp_path / "state", version="test")
    with caplog.at_level(logging.WARNING, logger="edged.mqtt"):
        front.start()
    sub = Subscriber(broker.port, ["nm/+/out"])
    try:
        assert any("'no_such_model' is not in the repository" in r.getMessage() for r in caplog.records)
        wait_until(lambda: front.status()["connected"], what="connected")
        wait_subscribed_to(sub, "nm/probe/out")
        sub.client.publish("nm/a/in", frame(0.5, "r-1"), 1)
        messages = sub.wait_for(1)
        wait_until(lambda: front.status()["errors"].get("model_missing") == 1, what="counted")
    finally:
        sub.close()
        front.stop(5)
    assert len(messages) == 1 and "no_such_model" in orjson.loads(messages[0].payload)["error"]


def test_a_shared_subscription_input_routes_its_messages(service: InferenceService, broker: Broker,
                                                         tmp_path: Path) -> None:
    """`$share/{group}/{filter}` spreads a sensor stream over several devices. Before, edged subscribed to it and
    then matched the messages' topics (`sensors/a/frame`, without the `$share/...` part) against the whole
    string: every input was dropped as `unrouted`, without a word."""
    config = MqttConfig(broker=broker.url, device_id="shared", pipelines=(
        PipelineConfig(input="$share/edged-fleet/shared/+/frame", model="tiny_mlp", output="shared-out/{1}"),))
    front = MqttFrontEnd(service, config, tmp_path / "state", version="test")
    front.start()
    sub = Subscriber(broker.port, ["shared-out/+"])
    try:
        wait_until(lambda: front.status()["subscribed"], what="subscribed")
        wait_subscribed_to(sub, "shared-out/probe")
        sub.client.publish("shared/door/frame", frame(0.5, "s-1"), 1)
        messages = sub.wait_for(1)
        assert [m.topic for m in messages] == ["shared-out/door"], front.status()["drops"]
        assert orjson.loads(messages[0].payload)["id"] == "s-1"
    finally:
        sub.close()
        front.stop(5)


@pytest.mark.parametrize(("route", "named"), [
    (("$share/g/loop/+", "loop/{1}"), "come back as inputs"),
    (("$share/g/#", "o/x"), "can match edged's own topics"),
    (("$share/g/edged/own/#", "o/{1}"), "can match edged's own topics"),
    (("$share/g+/in/+", "o/{1}"), "shared subscription"),
    (("$share/g", "o/x"), "shared subscription"),
], ids=["loop", "hash", "own-prefix", "wildcard-group", "no-filter"])
def test_shared_subscription_inputs_are_checked_as_their_filter(
        service: InferenceService, tmp_path: Path, route: tuple[str, str], named: str) -> None:
    config = MqttConfig(broker="mqtt://127.0.0.1:1", device_id="own", pipelines=(
        PipelineConfig(input=route[0], model="tiny_mlp", output=route[1]),))
    with pytest.raises((ConfigError, EdgedError)) as refused:
        MqttFrontEnd(service, config, tmp_path / "state", version="test")
    assert named in str(refused.value)


def test_a_pipeline_input_dropped_from_the_config_is_unsubscribed_at_the_next_start(
        service: InferenceService, broker: Broker, tmp_path: Path) -> None:
    """edged's session is persistent, so the broker keeps a subscription across restarts until it is undone.
    Before, an input filter taken out of the config (or changed) stayed subscribed for the session's life: its
    messages kept coming (dropped as unrouted), and one that overlapped the new filter (`$share/g/x/+` then
    `x/+`) reached edged twice, giving two results under two edged_message_ids for one input."""
    state = tmp_path / "state"
    old = MqttConfig(broker=broker.url, device_id="renamed", pipelines=(
        PipelineConfig(input="$share/g/moved/+/in", model="tiny_mlp", output="moved-out/{1}"),
        PipelineConfig(input="gone/+/in", model="tiny_mlp", output="gone-out/{1}")))
    front = MqttFrontEnd(service, old, state, version="test")
    front.start()
    wait_until(lambda: front.status()["subscribed"], what="subscribed")
    front.stop(5)
    new = MqttConfig(broker=broker.url, device_id="renamed", pipelines=(
        PipelineConfig(input="moved/+/in", model="tiny_mlp", output="moved-out/{1}"),))
    front = MqttFrontEnd(service, new, state, version="test")
    front.start()
    sub = Subscriber(broker.port, ["moved-out/+"])
    try:
        wait_until(lambda: front.status()["subscribed"], what="subscribed")
        wait_subscribed_to(sub, "moved-out/probe")
        sub.client.publish("gone/a/in", frame(0.5, "g-1"), 1)
        sub.client.publish("moved/a/in", frame(0.5, "m-1"), 1)
        messages = sub.wait_for(1)
        # the broker sends edged one session's messages in order: the input on gone/ came first, if at all
        wait_until(lambda: front.status()["outbox"]["depth"] == 0, what="the result acknowledged")
        status = front.status()
        assert [orjson.loads(m.payload)["id"] for m in messages] == ["m-1"]
        assert (status["messages_in"], status["drops"].get("unrouted", 0)) == (1, 0), status
    finally:
        sub.close()
        front.stop(5)


def test_loop_checks_of_many_hash_placeholders_against_a_deep_filter_finish(service: InferenceService,
                                                                            tmp_path: Path) -> None:
    """Before, `template_may_match` tried every split of the filter's levels afresh: twelve `{1}` of a `#`
    against a sixty-level filter never finished, and `edged serve` never started (fails here by the timeout)."""
    config = MqttConfig(broker="mqtt://127.0.0.1:1", device_id="deep", pipelines=(
        PipelineConfig(input="in/#", model="tiny_mlp", output="z/" + "/".join(["{1}"] * 12) + "/x"),
        PipelineConfig(input="z/" + "/".join(["+"] * 60) + "/y", model="tiny_mlp", output="o/{1}")))
    MqttFrontEnd(service, config, tmp_path / "state", version="test")

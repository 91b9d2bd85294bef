"""Chat over ``edged/{device_id}/chat`` on real mosquitto with the bundled generative model: OpenAI's chat JSON in,
one chat.completion (or QoS 0 chunks and a final chunk through the outbox) out, to the v5 ResponseTopic or the
3.1.1 ``reply_to``; hostile payloads get OpenAI's error JSON naming the problem."""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import paho.mqtt.client as paho
import pytest
from conftest import MODELS, Broker, Subscriber, wait_until
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from test_mqtt_requests import Requester, wait_subscribed

from edged.config import ModelsConfig, MqttConfig
from edged.engine import InferenceService
from edged.mqtt import MqttFrontEnd
from edged.serving.chat_codec import OpenAIChatCodec

CHAT = "edged/dev1/chat"
GOOD: dict[str, Any] = {"model": "tiny_llama", "messages": [{"role": "user", "content": "Open the gate"}],
                        "max_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def genai_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InferenceService]:
    pytest.importorskip("onnxruntime_genai")
    root = tmp_path_factory.mktemp("genai-models")
    for name in ("tiny_llama", "tiny_mlp"):
        shutil.copytree(MODELS / name, root / name)
    service = InferenceService(root, ModelsConfig())
    service.start()
    yield service
    service.close()


def front_end(service: InferenceService, broker: Broker, state: Path, protocol: str = "5") -> MqttFrontEnd:
    config = MqttConfig(broker=broker.url, device_id="dev1", protocol=protocol,  # type: ignore[arg-type]
                        max_payload_bytes=64 * 1024)
    front = MqttFrontEnd(service, config, state, version="test", chat=OpenAIChatCodec())
    front.start()
    # the birth follows the SUBSCRIBE on the same connection, so once it is seen the chat topic is subscribed
    status = Subscriber(broker.port, ["edged/dev1/status"], protocol=paho.MQTTv5 if protocol == "5"
                        else paho.MQTTv311)
    try:
        wait_until(lambda: any(orjson.loads(m.payload)["state"] == "online" for m in status.wait_for(1, 0.1)),
                   30, "the front end's birth")
    finally:
        status.close()
    return front


@pytest.fixture
def front(genai_service: InferenceService, broker: Broker, tmp_path: Path) -> Iterator[MqttFrontEnd]:
    fe = front_end(genai_service, broker, tmp_path / "state")
    yield fe
    fe.stop(5)


def chat(client: Requester, body: Any, qos: int = 1, final: bool = True) -> list[paho.MQTTMessage]:
    """Every reply to one request, up to its final message (a non-chunk, or a chunk with a finish reason)."""
    correlation = uuid.uuid4().bytes
    props = Properties(PacketTypes.PUBLISH)
    props.ResponseTopic = client.reply_topic
    props.CorrelationData = correlation
    client.client.publish(CHAT, body if isinstance(body, bytes) else orjson.dumps(body), qos, properties=props)
    deadline = time.monotonic() + 30  # a bound on waiting for the broker, not a timed assertion
    with client.cond:
        while time.monotonic() < deadline:
            mine = [m for m in client.messages if m.properties.CorrelationData == correlation]
            if mine and _is_final(orjson.loads(mine[-1].payload)):
                return mine
            client.cond.wait(0.1)
    raise AssertionError(f"no final reply to {body!r:.200}")


def _is_final(doc: dict[str, Any]) -> bool:
    return doc.get("object") != "chat.completion.chunk" or doc["choices"][0]["finish_reason"] is not None


def test_chat_answers_one_completion_and_streams_the_same_text(front: MqttFrontEnd, broker: Broker) -> None:
    client = Requester(broker.port)
    (reply,) = chat(client, GOOD)
    doc = orjson.loads(reply.payload)
    assert doc["object"] == "chat.completion" and doc["model"] == "tiny_llama"
    message = doc["choices"][0]["message"]
    assert message["role"] == "assistant" and message["content"]
    assert doc["choices"][0]["finish_reason"] in ("stop", "length")
    assert doc["usage"]["prompt_tokens"] > 0 and 0 < doc["usage"]["completion_tokens"] <= 12
    assert reply.qos == 1 and reply.properties.ContentType == "application/json"

    streamed = chat(client, {**GOOD, "stream": True, "stream_options": {"include_usage": True}})
    chunks = [orjson.loads(m.payload) for m in streamed]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == message["content"]
    assert len(chunks) > 3  # one message per piece, not one block
    assert chunks[-1]["choices"][0]["finish_reason"] == doc["choices"][0]["finish_reason"]
    assert chunks[-1]["usage"] == doc["usage"]
    # pieces at QoS 0 outside the outbox, the final chunk through it at the request's QoS
    assert [m.qos for m in streamed[:-1]] == [0] * (len(streamed) - 1) and streamed[-1].qos == 1
    assert front.status()["messages_in"] >= 2
    assert "edged_mqtt_chat_requests_total 2" in front.prometheus_lines()
    client.close()


def test_mqtt311_chat_replies_to_the_reply_to_in_the_payload(genai_service: InferenceService, broker: Broker,
                                                             tmp_path: Path) -> None:
    front = front_end(genai_service, broker, tmp_path / "state311", protocol="3.1.1")
    reply_topic = f"replies311/{uuid.uuid4().hex}"
    client = Subscriber(broker.port, [reply_topic], protocol=paho.MQTTv311)
    try:
        wait_subscribed(client)
        client.client.publish(CHAT, orjson.dumps({**GOOD, "reply_to": reply_topic}), 1)
        doc = orjson.loads(client.wait_for(1, 30)[0].payload)
        assert doc["object"] == "chat.completion" and doc["choices"][0]["message"]["content"]
    finally:
        client.close()
        front.stop(5)


@pytest.mark.parametrize(("body", "param", "words"), [
    (b"{not json", None, "not valid JSON"),
    (b"[1]", None, "must be a JSON object"),
    ({**GOOD, "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role", "wizard"),
    ({**GOOD, "logprobs": True}, "logprobs", "unsupported parameter(s) logprobs"),
    ({**GOOD, "temperature": 9}, "temperature", "from 0.0 to 2.0"),
    ({**GOOD, "max_tokens": 100000}, "max_tokens", "does not fit"),
    ({**GOOD, "model": "nope"}, None, "'nope' is not in the repository"),
    ({**GOOD, "model": "tiny_mlp"}, "model", "not a generative model"),
    ({**GOOD, "reply_to": 7}, None, "'reply_to' must be a topic name"),
    (b"x" * (65 * 1024), None, "max_payload_bytes is 65536"),
])
def test_hostile_chats_get_an_error_naming_the_problem(front: MqttFrontEnd, broker: Broker, body: Any,
                                                       param: str | None, words: str) -> None:
    client = Requester(broker.port)
    (reply,) = chat(client, body)
    error = orjson.loads(reply.payload)["error"]
    assert words in error["message"] and error["param"] == param, error
    (good,) = chat(client, GOOD)  # and the next chat is served
    assert orjson.loads(good.payload)["object"] == "chat.completion"
    client.close()


def test_a_stream_that_fails_ends_with_an_error_message(front: MqttFrontEnd, broker: Broker) -> None:
    client = Requester(broker.port)
    too_long = {**GOOD, "stream": True, "messages": [{"role": "user", "content": "gate " * 400}]}
    replies = chat(client, too_long)
    assert "error" in orjson.loads(replies[-1].payload) and replies[-1].qos == 1
    assert all(m.qos == 0 for m in replies[:-1])
    client.close()


def test_the_birth_message_names_the_chat_topic_and_its_models(front: MqttFrontEnd, broker: Broker) -> None:
    status = Subscriber(broker.port, ["edged/dev1/status"])
    try:
        doc = orjson.loads(status.wait_for(1)[0].payload)  # retained: the front end is connected
    finally:
        status.close()
    assert doc["capabilities"]["chat"] == {"topic": CHAT, "models": ["tiny_llama"]}


def test_a_chat_with_nowhere_to_reply_is_dropped_and_counted(front: MqttFrontEnd, broker: Broker) -> None:
    client = Subscriber(broker.port, [])
    try:
        client.client.publish(CHAT, orjson.dumps(GOOD), 1)  # v5 without ResponseTopic, and no reply_to
        wait_until(lambda: front.status()["drops"].get("no_reply_topic", 0) == 1, what="the drop to be counted")
    finally:
        client.close()


GATE = {"type": "function", "function": {"name": "gate", "parameters": {"properties": {"side": {"enum": ["n", "s"]}},
                                                                        "required": ["side"]}}}


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_tool_call_comes_back_parsed(front: MqttFrontEnd, broker: Broker, stream: bool) -> None:
    client = Requester(broker.port)
    body = {**GOOD, "tools": [GATE], "tool_choice": "required", "max_tokens": 60, "stream": stream}
    replies = chat(client, body)
    client.close()
    final = orjson.loads(replies[-1].payload)
    assert final["choices"][0]["finish_reason"] == "tool_calls", final
    calls = final["choices"][0]["message" if not stream else "delta"]["tool_calls"]
    assert [(c["type"], c["function"]["name"]) for c in calls] == [("function", "gate")]
    assert orjson.loads(calls[0]["function"]["arguments"])["side"] in ("n", "s")
    assert replies[-1].qos == 1

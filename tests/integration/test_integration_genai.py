"""The real daemon serves the bundled generative model out of the box: the official openai client, bound to the
daemon's Unix socket, lists it and streams a chat completion; `edged status` shows it like any other model; with
a broker configured, edged/{device_id}/chat answers a streamed chat over MQTT."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import paho.mqtt.client as paho
import pytest
from integration.edged_daemon import daemon_environment, start_daemon
from mqtt.conftest import Broker, Subscriber

openai = pytest.importorskip("openai")
pytest.importorskip("onnxruntime_genai")


def test_daemon_serves_the_bundled_tiny_llama_to_the_openai_client(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, config='[telemetry]\nsource = "off"\n')
    try:
        client = openai.OpenAI(base_url="http://localhost/v1", api_key="unused", max_retries=0,
                               http_client=httpx.Client(transport=httpx.HTTPTransport(uds=str(daemon.socket_path))))
        assert "tiny_llama" in [m.id for m in client.models.list()]
        chunks = list(client.chat.completions.create(
            model="tiny_llama", messages=[{"role": "user", "content": "Open the gate"}], max_tokens=8,
            temperature=0, stream=True))
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        status = subprocess.run([sys.executable, "-m", "edged", "status", "--socket", str(daemon.socket_path),
                                 "--json"], capture_output=True, text=True, env=daemon_environment(), check=True)
        assert "tiny_llama" in json.dumps(json.loads(status.stdout))
    finally:
        assert daemon.stop() == 0


def test_daemon_answers_a_streamed_chat_on_its_mqtt_chat_topic(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "broker")
    broker.start()
    try:
        daemon = start_daemon(tmp_path / "edged", config=f'[telemetry]\nsource = "off"\n\n[mqtt]\n'
                              f'broker = "{broker.url}"\ndevice_id = "cam1"\nprotocol = "3.1.1"\n')
        listener = Subscriber(broker.port, ["answers/chat", "edged/cam1/status"], protocol=paho.MQTTv311)
        try:
            listener.wait_for(1, 30)  # the retained birth: the daemon is connected and subscribed
            body = {"model": "tiny_llama", "messages": [{"role": "user", "content": "Open the gate"}],
                    "max_tokens": 8, "temperature": 0, "stream": True, "reply_to": "answers/chat"}
            listener.client.publish("edged/cam1/chat", orjson.dumps(body), 1)
            deadline = time.monotonic() + 60  # a bound on waiting for the broker, not a timed assertion
            chunks: list[dict[str, Any]] = []
            while time.monotonic() < deadline and not (chunks and chunks[-1]["choices"][0]["finish_reason"]):
                chunks = [orjson.loads(m.payload) for m in listener.wait_for(len(chunks) + 2, 1)
                          if m.topic == "answers/chat"]
            assert chunks and chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length"), chunks
            assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        finally:
            listener.close()
            assert daemon.stop() == 0
    finally:
        broker.stop()

"""The retained ``{prefix}/status`` messages: birth on every (re)connect, last will, and stopped."""

from __future__ import annotations

import time
from typing import Any

import orjson

from edged.config import MqttConfig
from edged.mqtt._codecs import CODECS


def birth(device_id: str, version: str, models: list[str], config: MqttConfig, protocol: str,
          health: str = "ok", reason: str = "", chat_models: list[str] | None = None) -> bytes:
    """"online", or "degraded" with the reason while a supervised part of the daemon is not healthy;
    ``chat_models``: the generative models ``{prefix}/chat`` answers with (None: the chat topic is off)."""
    doc: dict[str, Any] = {
        "state": "online" if health == "ok" else "degraded", "device_id": device_id, "version": version,
        "models": sorted(models),
        "capabilities": {"protocol": protocol, "codecs": list(CODECS), "request_response": True,
                         "pipelines": [{"input": p.input, "model": p.model, "output": p.output}
                                       for p in config.pipelines],
                         "max_payload_bytes": config.max_payload_bytes},
        "timestamp": time.time(),
    }
    if chat_models is not None:
        doc["capabilities"]["chat"] = {"topic": f"edged/{device_id}/chat", "models": sorted(chat_models)}
    if health != "ok":
        doc["reason"] = reason
    return orjson.dumps(doc)


def offline(device_id: str) -> bytes:
    return orjson.dumps({"state": "offline", "device_id": device_id})


def stopped(device_id: str) -> bytes:
    return orjson.dumps({"state": "stopped", "device_id": device_id, "timestamp": time.time()})

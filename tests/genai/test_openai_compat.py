"""What current OpenAI clients send, and what OpenAI's API documents about it, against a real server."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import server_harness as harness

openai = pytest.importorskip("openai")

ASK = [{"role": "user", "content": "Open the gate"}]
CHAT = {"model": "tiny_llama", "messages": ASK, "max_tokens": 6, "temperature": 0}
COMPLETION = {"model": "tiny_llama", "prompt": "Open the gate", "max_tokens": 6, "temperature": 0}


def post(server: harness.ThreadedServer, path: str, body: dict[str, Any]) -> httpx.Response:
    with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=60) as http:
        return http.post(path, content=orjson.dumps(body))


def client(server: harness.ThreadedServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0)


def test_a_developer_message_is_the_system_message_of_newer_clients(genai_server: harness.ThreadedServer) -> None:
    # OpenAI's clients write the instructions as role "developer" (it replaces "system" for newer models)
    def answer(role: str) -> Any:
        return client(genai_server).chat.completions.create(
            model="tiny_llama", messages=[{"role": role, "content": "You are terse."}, *ASK], max_tokens=6,
            temperature=0)
    developer, system = answer("developer"), answer("system")
    assert developer.choices[0].message.content == system.choices[0].message.content
    assert developer.usage == system.usage, "the same prompt reached the model"
    alone = client(genai_server).chat.completions.create(model="tiny_llama", messages=ASK, max_tokens=6,
                                                         temperature=0)
    assert developer.usage.prompt_tokens > alone.usage.prompt_tokens, "the instructions were rendered"

"""What current OpenAI clients send, and what OpenAI's API documents about it, against a real server: the
``developer`` role, parameters edged does not implement sent at their documented no-effect value, the ``usage``
field of streamed chunks, and the field a too-large token limit is named by."""

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


# OpenAI documents each of these values as the parameter's default: the answer is what it is without them
CHAT_NO_EFFECT = [("frequency_penalty", 0), ("presence_penalty", 0.0), ("logit_bias", {}), ("logprobs", False),
                  ("logprobs", None), ("top_logprobs", None), ("store", False), ("modalities", ["text"]),
                  ("presence_penalty", None), ("functions", None), ("function_call", None), ("metadata", None),
                  ("service_tier", None), ("prediction", None), ("reasoning_effort", None), ("audio", None),
                  ("verbosity", None), ("moderation", None), ("prompt_cache_retention", None),
                  # identifiers for OpenAI's abuse monitoring and its prompt cache, as `user` is: any value
                  ("safety_identifier", "user-7"), ("prompt_cache_key", "gate-app")]
COMPLETION_NO_EFFECT = [("frequency_penalty", 0), ("presence_penalty", 0), ("logit_bias", {}), ("echo", False),
                        ("best_of", 1), ("logprobs", None), ("suffix", None), ("best_of", None)]


@pytest.mark.parametrize(("name", "value"), CHAT_NO_EFFECT)
def test_a_chat_parameter_at_its_no_effect_value_is_accepted(genai_server: harness.ThreadedServer, name: str,
                                                             value: Any) -> None:
    plain = post(genai_server, "/v1/chat/completions", CHAT)
    reply = post(genai_server, "/v1/chat/completions", {**CHAT, name: value})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"] == plain.json()["choices"]


@pytest.mark.parametrize(("name", "value"), COMPLETION_NO_EFFECT)
def test_a_completion_parameter_at_its_no_effect_value_is_accepted(genai_server: harness.ThreadedServer, name: str,
                                                                   value: Any) -> None:
    plain = post(genai_server, "/v1/completions", COMPLETION)
    reply = post(genai_server, "/v1/completions", {**COMPLETION, name: value})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"] == plain.json()["choices"]


@pytest.mark.parametrize(("path", "base", "name", "value"), [
    ("/v1/chat/completions", CHAT, "frequency_penalty", 0.5), ("/v1/chat/completions", CHAT, "presence_penalty", -1),
    ("/v1/chat/completions", CHAT, "logit_bias", {"5": 100}), ("/v1/chat/completions", CHAT, "logprobs", True),
    ("/v1/chat/completions", CHAT, "top_logprobs", 2), ("/v1/chat/completions", CHAT, "store", True),
    ("/v1/chat/completions", CHAT, "modalities", ["text", "audio"]), ("/v1/chat/completions", CHAT, "audio", {}),
    ("/v1/chat/completions", CHAT, "frequency_penalty", "0"), ("/v1/chat/completions", CHAT, "logprobs", 0),
    ("/v1/completions", COMPLETION, "echo", True), ("/v1/completions", COMPLETION, "best_of", 2),
    ("/v1/completions", COMPLETION, "logprobs", 0), ("/v1/completions", COMPLETION, "suffix", "x"),
    ("/v1/chat/completions", CHAT, "no_such_parameter", None),
])
def test_a_parameter_with_an_effect_edged_lacks_is_a_400_naming_it(genai_server: harness.ThreadedServer, path: str,
                                                                   base: dict[str, Any], name: str,
                                                                   value: Any) -> None:
    reply = post(genai_server, path, {**base, name: value})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == name and name in error["message"] and error["type"] == "invalid_request_error"


@pytest.mark.parametrize(("path", "base"), [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)])
def test_with_include_usage_every_chunk_carries_usage_null_but_the_last(genai_server: harness.ThreadedServer,
                                                                        path: str, base: dict[str, Any]) -> None:
    # OpenAI: "All other chunks will also include a usage field, but with a null value."
    body = {**base, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.Client(base_url=f"http://127.0.0.1:{genai_server.port}", timeout=60) as http:
        events = [line for line in http.post(path, content=orjson.dumps(body)).text.splitlines() if line]
    assert events[-1] == "data: [DONE]"
    docs = [orjson.loads(event.removeprefix("data: ")) for event in events[:-1]]
    assert len(docs) >= 3
    assert all("usage" in doc and doc["usage"] is None for doc in docs[:-1]), docs
    assert docs[-1]["choices"] == [] and docs[-1]["usage"]["completion_tokens"] == 6
    without = {**base, "stream": True}
    with httpx.Client(base_url=f"http://127.0.0.1:{genai_server.port}", timeout=60) as http:
        events = [line for line in http.post(path, content=orjson.dumps(without)).text.splitlines() if line]
    assert not any("usage" in orjson.loads(event.removeprefix("data: ")) for event in events[:-1])


@pytest.mark.parametrize("obfuscation", [False, True])
def test_stream_options_include_obfuscation_is_taken(genai_server: harness.ThreadedServer, obfuscation: bool) -> None:
    # OpenAI pads streamed chunks against network side channels unless told not to; over loopback and a Unix
    # socket edged pads nothing, which changes no answer
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True, "include_obfuscation": obfuscation}}
    with httpx.Client(base_url=f"http://127.0.0.1:{genai_server.port}", timeout=60) as http:
        reply = http.post("/v1/chat/completions", content=orjson.dumps(body))
    assert reply.status_code == 200, reply.text
    assert reply.text.rstrip().endswith("data: [DONE]") and '"completion_tokens":6' in reply.text
    bad = {**body, "stream_options": {"include_obfuscation": "no"}}
    assert post(genai_server, "/v1/chat/completions", bad).json()["error"]["param"] == "stream_options"


def test_a_max_completion_tokens_too_large_is_named_as_sent(genai_server: harness.ThreadedServer) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client(genai_server).chat.completions.create(model="tiny_llama", messages=ASK, max_completion_tokens=300)
    assert refused.value.param == "max_completion_tokens"
    assert "lower max_completion_tokens" in refused.value.message and "max_tokens " not in refused.value.message
    with pytest.raises(openai.BadRequestError) as classic:
        client(genai_server).chat.completions.create(model="tiny_llama", messages=ASK, max_tokens=300)
    assert classic.value.param == "max_tokens"

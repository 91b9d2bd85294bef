"""/v1/completions (a prompt string, no chat template) through the official openai client, checked against
ONNX Runtime GenAI's own generator loop in process."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import server_harness as harness
from reference import og_greedy

openai = pytest.importorskip("openai")

PROMPT = "The first token takes longest, because"


def client_for(server: harness.ThreadedServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0)


def test_greedy_completion_equals_in_process_generator(genai_server: harness.ThreadedServer,
                                                       model_dir: Path) -> None:
    reply = client_for(genai_server).completions.create(model="tiny_llama", prompt=PROMPT, max_tokens=20,
                                                        temperature=0)
    prompt_ids, new_ids, text = og_greedy(model_dir, PROMPT, 20)
    assert reply.object == "text_completion"
    assert reply.choices[0].text == text
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(prompt_ids), len(new_ids))


def test_streamed_completion_gives_the_same_text(genai_server: harness.ThreadedServer) -> None:
    client = client_for(genai_server)
    whole = client.completions.create(model="tiny_llama", prompt=PROMPT, max_tokens=20, temperature=0)
    chunks = list(client.completions.create(model="tiny_llama", prompt=PROMPT, max_tokens=20, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage == whole.usage


def test_default_max_tokens_is_sixteen_as_openai_defines(genai_server: harness.ThreadedServer,
                                                         model_dir: Path) -> None:
    reply = client_for(genai_server).completions.create(model="tiny_llama", prompt=PROMPT, temperature=0)
    _, new_ids, _ = og_greedy(model_dir, PROMPT, 16)
    assert reply.usage.completion_tokens == len(new_ids) <= 16


def test_chat_fields_are_refused_on_completions(genai_server: harness.ThreadedServer) -> None:
    body = {"model": "tiny_llama", "prompt": PROMPT, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=f"http://127.0.0.1:{genai_server.port}") as http:
        response = http.post("/v1/completions", json=body)
        missing = http.post("/v1/completions", json={"model": "tiny_llama"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages"
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "prompt"


def test_a_prompt_with_a_nul_is_refused_not_cut_short(genai_server: harness.ThreadedServer) -> None:
    # the tokenizer takes a C string: "a\0b" was generated from "a", the rest dropped without a word
    with httpx.Client(base_url=f"http://127.0.0.1:{genai_server.port}") as http:
        response = http.post("/v1/completions", json={"model": "tiny_llama", "prompt": "The gate\u0000 is open"})
        generate = http.post("/v2/models/tiny_llama/generate", json={"text_input": "a\u0000b"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "prompt" and "NUL character" in error["message"] and "index 8" in error["message"]
    assert generate.status_code == 400 and "NUL character" in generate.json()["error"]

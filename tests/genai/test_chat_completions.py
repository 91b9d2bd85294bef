"""/v1/chat/completions through the official openai client, over loopback TCP and over the Unix socket, checked
against ONNX Runtime GenAI's own generator loop and transformers' rendering of the model's chat template."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import server_harness as harness
from reference import og_greedy, render_with_transformers

openai = pytest.importorskip("openai")

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Open the gate"},
            {"role": "assistant", "content": "Which gate?"}, {"role": "tool", "content": "{\"gate\": \"north\"}"},
            {"role": "user", "content": "The north one"}]


def tcp_client(server: harness.ThreadedServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0)


def uds_client(server: harness.ThreadedServer) -> openai.OpenAI:
    transport = httpx.HTTPTransport(uds=server.socket_path)
    return openai.OpenAI(base_url="http://localhost/v1", api_key="unused", max_retries=0,
                         http_client=httpx.Client(transport=transport))


def test_models_lists_only_generative_models(genai_server: harness.ThreadedServer) -> None:
    ids = [m.id for m in tcp_client(genai_server).models.list()]
    assert ids == ["tiny_llama"]


def test_generative_model_is_listed_unbatched_in_status(genai_server: harness.ThreadedServer) -> None:
    with httpx.Client(base_url=f"http://127.0.0.1:{genai_server.port}") as http:
        config = http.get("/v2/models/tiny_llama/config").json()
        index = http.post("/v2/repository/index").json()
    assert config["backend"] == "onnxruntime_genai" and config["max_batch_size"] == 0
    assert {"name": "tiny_llama", "version": "1", "state": "READY", "reason": ""} in index


@pytest.mark.parametrize("client_for", [tcp_client, uds_client], ids=["tcp", "uds"])
def test_greedy_chat_equals_in_process_generator(genai_server: harness.ThreadedServer, model_dir: Path,
                                                 client_for: object) -> None:
    client = client_for(genai_server)  # type: ignore[operator]
    reply = client.chat.completions.create(model="tiny_llama", messages=MESSAGES, max_tokens=16, temperature=0)
    prompt = render_with_transformers(model_dir, MESSAGES)
    prompt_ids, new_ids, text = og_greedy(model_dir, prompt, 16)
    assert reply.usage.prompt_tokens == len(prompt_ids)
    assert reply.usage.completion_tokens == len(new_ids)
    assert reply.choices[0].message.content == text
    assert reply.choices[0].finish_reason == ("length" if len(new_ids) == 16 else "stop")


def test_streaming_gives_the_text_of_non_streaming(genai_server: harness.ThreadedServer) -> None:
    client = uds_client(genai_server)
    whole = client.chat.completions.create(model="tiny_llama", messages=MESSAGES, max_tokens=20, temperature=0)
    chunks = list(client.chat.completions.create(model="tiny_llama", messages=MESSAGES, max_tokens=20,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_stream_is_chunked_sse_ending_with_done(genai_server: harness.ThreadedServer) -> None:
    body = {"model": "tiny_llama", "messages": MESSAGES, "max_tokens": 4, "stream": True}
    with httpx.Client(base_url=f"http://127.0.0.1:{genai_server.port}") as http, \
            http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.headers["content-type"] == "text/event-stream"
        assert response.headers["transfer-encoding"] == "chunked"
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    docs = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert docs[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(d["object"] == "chat.completion.chunk" for d in docs)


def test_stop_string_cuts_the_answer(genai_server: harness.ThreadedServer) -> None:
    client = tcp_client(genai_server)
    whole = client.chat.completions.create(model="tiny_llama", messages=MESSAGES, max_tokens=16, temperature=0)
    text = whole.choices[0].message.content
    stop = text[3:5]
    cut = client.chat.completions.create(model="tiny_llama", messages=MESSAGES, max_tokens=16, temperature=0,
                                         stop=[stop])
    assert cut.choices[0].message.content == text[:text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_longer_stop_strings_cut_the_answer_wherever_they_start(genai_server: harness.ThreadedServer) -> None:
    """Stops of 3-5 characters at every place in the greedy answer (a stop longer than the text held so far was
    missed: the hold went negative and released what it should keep)."""
    client = tcp_client(genai_server)
    whole = client.chat.completions.create(model="tiny_llama", messages=MESSAGES, max_tokens=16, temperature=0)
    text = whole.choices[0].message.content
    assert text is not None and len(text) >= 8, text
    for length in (3, 4, 5):
        for start in range(0, len(text) - length, 2):
            stop = text[start:start + length]
            cut = client.chat.completions.create(model="tiny_llama", messages=MESSAGES, max_tokens=16,
                                                 temperature=0, stop=[stop])
            assert (cut.choices[0].message.content, cut.choices[0].finish_reason) == \
                (text[:text.find(stop)], "stop"), (stop, text)


def test_seeded_sampling_repeats(genai_server: harness.ThreadedServer) -> None:
    client = tcp_client(genai_server)
    replies = [client.chat.completions.create(model="tiny_llama", messages=MESSAGES, max_tokens=12,
                                              temperature=1.0, top_p=0.9, seed=7,
                                              extra_body={"top_k": 50}).choices[0].message.content
               for _ in range(2)]
    assert replies[0] == replies[1]

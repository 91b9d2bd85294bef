"""Every error under /v1 is OpenAI's ``{"error": {"message", "type", "param", "code"}}``, as OpenAI's clients read
it: unknown routes, wrong methods (405 with ``Allow``), ``GET /v1/models/{model}`` (``models.retrieve``), a
full generation line (429 with ``Retry-After``), and a prompt past the context naming the field that holds it.
The KServe routes keep Triton's ``{"error": "..."}``."""

from __future__ import annotations

import json
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import server_harness as harness

openai = pytest.importorskip("openai")

ASK = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server() -> Iterator[harness.ThreadedServer]:
    pytest.importorskip("onnxruntime_genai")
    running = harness.ThreadedServer(models=("tiny_llama",), tcp=True)
    config = Path(running.repository) / "tiny_llama" / "config.pbtxt"
    # no line: a second request while one generates is refused at once, so a 429 needs no flood
    config.write_text(config.read_text() + 'parameters { key: "max_waiting" value: { string_value: "0" } }\n')
    yield running.start()
    running.stop()


@pytest.fixture()
def http(server: harness.ThreadedServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=30) as client:
        yield client


@pytest.fixture()
def client(server: harness.ThreadedServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0)


def _openai_error(response: httpx.Response) -> dict[str, object]:
    error = response.json()["error"]
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}, response.text
    assert isinstance(error["message"], str) and error["message"]
    return error


def test_an_unknown_v1_route_is_openais_404(http: httpx.Client, client: openai.OpenAI) -> None:
    for method, path in [("POST", "/v1/embeddings"), ("GET", "/v1"), ("GET", "/v1/models/tiny_llama/extra")]:
        response = http.request(method, path, json={"model": "tiny_llama", "input": "x"})
        assert response.status_code == 404
        error = _openai_error(response)
        assert error["code"] == "unknown_url" and f"{method} {path}" in str(error["message"])
        assert "POST /v1/chat/completions" in str(error["message"]), "it says what is served"
    bad_name = http.get("/v1/models/%FF")
    assert bad_name.status_code == 400 and "percent-encoded" in str(_openai_error(bad_name)["message"])
    with pytest.raises(openai.NotFoundError, match="unknown request URL POST /v1/embeddings"):
        client.embeddings.create(model="tiny_llama", input="x")


@pytest.mark.parametrize("method, path, allowed", [("GET", "/v1/chat/completions", "POST"),
                                                   ("GET", "/v1/completions", "POST"),
                                                   ("POST", "/v1/models", "GET"),
                                                   ("DELETE", "/v1/models/tiny_llama", "GET")])
def test_a_wrong_method_on_v1_is_openais_405_with_allow(http: httpx.Client, method: str, path: str,
                                                        allowed: str) -> None:
    response = http.request(method, path)
    header = "GET, HEAD" if allowed == "GET" else allowed  # HEAD is answered wherever GET is (RFC 9110)
    assert response.status_code == 405 and response.headers["allow"] == header
    error = _openai_error(response)
    assert error["type"] == "invalid_request_error" and f"use {allowed}" in str(error["message"])


def test_kserve_routes_keep_tritons_error_shape_and_a_405_names_allow(http: httpx.Client) -> None:
    wrong = http.get("/v2/repository/index")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert wrong.json() == {"error": "method GET is not allowed here; use POST"}
    infer = http.get("/v2/models/tiny_llama/infer")
    assert infer.status_code == 405 and infer.headers["allow"] == "POST" and isinstance(infer.json()["error"], str)
    unknown = http.get("/v2/nothing/here")
    assert unknown.status_code == 404 and unknown.json() == {"error": "Not Found"}
    assert http.get("/v1models").json() == {"error": "Not Found"}, "only /v1 and below is OpenAI's"


def test_models_retrieve_answers_the_listed_model_or_model_not_found(http: httpx.Client,
                                                                     client: openai.OpenAI) -> None:
    model = client.models.retrieve("tiny_llama")
    listed = next(m for m in client.models.list() if m.id == "tiny_llama")
    assert model == listed and model.object == "model" and model.owned_by == "edged"
    assert time.time() - 3600 < model.created <= time.time(), "when it was loaded, in Unix seconds"
    with pytest.raises(openai.NotFoundError) as raised:
        client.models.retrieve("no_such_model")
    assert raised.value.status_code == 404 and raised.value.code == "model_not_found"
    response = http.get("/v1/models/no_such_model")
    assert _openai_error(response)["code"] == "model_not_found" and "GET /v1/models" in response.text


def test_a_prompt_past_the_context_names_the_routes_own_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as completion:
        client.completions.create(model="tiny_llama", prompt="x " * 300, max_tokens=4)
    assert completion.value.param == "prompt" and "tokens of prompt and output together" in completion.value.message
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(model="tiny_llama", messages=[{"role": "user", "content": "x " * 300}],
                                       max_tokens=4)
    assert chat.value.param == "messages"
    assert completion.value.code == chat.value.code == "context_length_exceeded", "OpenAI's code for it"


def test_a_prompt_plus_max_tokens_past_the_context_names_the_prompt_field(client: openai.OpenAI) -> None:
    # 256 tokens of context: the prompt fits alone, max_tokens fits alone, together they do not
    with pytest.raises(openai.BadRequestError) as completion:
        client.completions.create(model="tiny_llama", prompt="x " * 20, max_tokens=240)
    assert completion.value.param == "prompt" and "shorten the prompt" in completion.value.message
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(model="tiny_llama", messages=[{"role": "user", "content": "x " * 100}],
                                       max_tokens=200)
    assert chat.value.param == "messages"
    with pytest.raises(openai.BadRequestError) as alone:
        client.completions.create(model="tiny_llama", prompt="x", max_tokens=256)
    assert alone.value.param == "max_tokens"
    assert {e.value.code for e in (completion, chat, alone)} == {"context_length_exceeded"}


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_a_huge_prompt_is_refused_by_its_size_before_it_is_tokenized(http: httpx.Client, route: str) -> None:
    # 20 MB of text in a body the server takes: tokenizing it (ORT GenAI holds the GIL) held the daemon for
    # seconds before the token count refused it; 256 tokens of context take at most 256 * 64 bytes
    text = "the gate opens " * 1_400_000
    chat = "chat" in route
    body = ({"model": "tiny_llama", "messages": [{"role": "user", "content": text}]} if chat
            else {"model": "tiny_llama", "prompt": text})
    response = http.post(route, json=body)
    assert response.status_code == 400, response.text[:300]
    error = _openai_error(response)
    assert error["code"] == "context_length_exceeded"
    assert error["param"] == ("messages" if chat else "prompt")
    message = str(error["message"])
    assert f"the prompt is {len(text)} bytes" in message and "at most 16384 bytes" in message, message
    assert http.get("/v2/health/ready").status_code == 200
    small = {"model": "tiny_llama", "prompt": "The", "max_tokens": 2}
    assert http.post("/v1/completions", json=small).status_code == 200


def test_a_full_line_is_a_429_with_retry_after(server: harness.ThreadedServer, http: httpx.Client,
                                              client: openai.OpenAI) -> None:
    body = {"model": "tiny_llama", "prompt": "The", "max_tokens": 240, "temperature": 0, "stream": True}
    refused = None
    for _ in range(20):  # a generation that ends before the second request arrives frees its slot: try again
        with http.stream("POST", "/v1/completions", json=body) as generating:
            assert generating.status_code == 200
            next(generating.iter_lines())  # it holds the model's one sequence now
            second = http.post("/v1/completions", json={**body, "stream": False})
        if second.status_code == 429:
            refused = second
            break
    assert refused is not None, "no request was refused while another generated"
    assert refused.headers["retry-after"] == "1", "the Retry-After of edged's 503s"
    error = _openai_error(refused)
    assert error["type"] == "rate_limit_error" and "max_waiting" in str(error["message"])


def raw_answer(port: int, request: bytes) -> tuple[bytes, bytes]:
    """(status line and headers, body) of what the server answers ``request`` before it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(request)
        answer = b""
        while chunk := raw.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, body


@pytest.mark.parametrize(("headers", "body", "status", "words"), [
    (b"Content-Length: 70000000\r\n", b"", b"413 Payload Too Large", "larger than the limit"),
    (b"Content-Encoding: br\r\nContent-Length: 2\r\n", b"{}", b"415 Unsupported Media Type", "'br'"),
    (b"Transfer-Encoding: gzip\r\n", b"", b"501 Not Implemented", "Transfer-Encoding 'gzip'"),
    (b"Content-Encoding: gzip\r\nContent-Length: 5\r\n", b"abcde", b"400 Bad Request", "not valid"),
])
def test_a_refusal_below_the_openai_layer_is_openais_error_json(server: harness.ThreadedServer, headers: bytes,
                                                                body: bytes, status: bytes, words: str) -> None:
    for path in (b"/v1/chat/completions", b"/v1/nowhere"):
        head, answer = raw_answer(server.port, b"POST " + path + b" HTTP/1.1\r\nHost: x\r\n" + headers
                                  + b"\r\n" + body)
        assert head.startswith(b"HTTP/1.1 " + status + b"\r\n") and b"connection: close" in head
        error = json.loads(answer)["error"]
        assert set(error) == {"message", "type", "param", "code"} and words in error["message"]
        assert error["type"] == "invalid_request_error"
    head, answer = raw_answer(server.port, b"POST /v2/models/tiny_llama/infer HTTP/1.1\r\nHost: x\r\n" + headers
                              + b"\r\n" + body)
    assert head.startswith(b"HTTP/1.1 " + status) and isinstance(json.loads(answer)["error"], str)  # Triton's


def test_access_denied_on_v1_is_openais_403_and_tritons_on_v2() -> None:
    pytest.importorskip("onnxruntime_genai")
    restricted = harness.ThreadedServer(models=("tiny_llama",), tcp=True,
                                        tcp_restricted={"inference": "edged-key=v"}).start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{restricted.port}", timeout=30) as http:
            denied = http.get("/v1/models")
            assert denied.status_code == 403 and _openai_error(denied)["type"] == "permission_error"
            assert http.get("/v1/models", headers={"edged-key": "v"}).status_code == 200
            kserve = http.post("/v2/models/tiny_llama/generate", json={"text_input": "hi"})
            assert kserve.status_code == 403 and isinstance(kserve.json()["error"], str)
    finally:
        restricted.stop()


def test_a_model_that_failed_to_load_or_is_not_loaded_is_a_404_as_models_retrieve_says() -> None:
    pytest.importorskip("onnxruntime_genai")
    running = harness.ThreadedServer(models=("tiny_llama",), tcp=True, control_mode="explicit",
                                     startup_models=("tiny_llama",))
    repository = Path(running.repository)
    for name in ("bad", "idle"):
        shutil.copytree(repository / "tiny_llama", repository / name)
        config = repository / name / "config.pbtxt"
        config.write_text(config.read_text().replace("tiny_llama", name))
    bad = repository / "bad" / "config.pbtxt"
    bad.write_text(bad.read_text() + 'parameters { key: "temperature" value: { string_value: "0.5" } }\n')
    running.start()
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=running.socket_path), base_url="http://x",
                          timeout=30) as uds:
            refused = uds.post("/v2/repository/models/bad/load")
            assert refused.status_code >= 400 and "mean nothing" in refused.text
            assert uds.post("/v2/repository/models/idle/load").status_code == 200
            assert uds.post("/v2/repository/models/idle/unload").status_code == 200
        with httpx.Client(base_url=f"http://127.0.0.1:{running.port}", timeout=30) as http:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{running.port}/v1", api_key="unused",
                                   max_retries=0)
            for name, words in (("bad", "its load failed"), ("idle", "in the repository but not loaded")):
                assert http.get(f"/v1/models/{name}").status_code == 404
                for chat in (True, False):
                    with pytest.raises(openai.NotFoundError) as raised:
                        if chat:
                            client.chat.completions.create(model=name, messages=ASK, max_tokens=2)
                        else:
                            client.completions.create(model=name, prompt="x", max_tokens=2)
                    assert raised.value.code == "model_not_found" and words in raised.value.message
                    assert "/v2/repository/models/" + name + "/load" in raised.value.message
            assert client.completions.create(model="tiny_llama", prompt="x", max_tokens=1).choices
    finally:
        running.stop()

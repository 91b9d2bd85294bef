"""Triton's generate extension on the bundled generative model, over real HTTP on the Unix socket and loopback
TCP: /generate answers one object, /generate_stream the same text as Server-Sent Events, bad requests get
Triton's error JSON naming what was wrong, and /v2 advertises the extension."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import server_harness as harness  # tests/server_harness.py
from prometheus_client.parser import text_string_to_metric_families

GOOD: dict[str, Any] = {"text_input": "Open the gate", "parameters": {"max_tokens": 12, "temperature": 0}}


@contextlib.contextmanager
def client(server: harness.ThreadedServer, over: str = "uds") -> Iterator[httpx.Client]:
    if over == "uds":
        with httpx.Client(transport=httpx.HTTPTransport(uds=server.socket_path), base_url="http://edged") as http:
            yield http
    else:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.port}") as http:
            yield http


def events(response: httpx.Response) -> list[dict[str, Any]]:
    lines = [line for line in response.text.split("\n\n") if line]
    assert all(line.startswith("data: ") for line in lines), response.text
    return [orjson.loads(line[6:]) for line in lines]


def error_of(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    message: str = body["error"]
    return message


@pytest.mark.parametrize("over", ["uds", "tcp"])
def test_generate_answers_the_same_text_as_a_greedy_completion(genai_server: harness.ThreadedServer,
                                                               over: str) -> None:
    with client(genai_server, over) as http:
        reply = http.post("/v2/models/tiny_llama/generate", json=GOOD)
        completion = http.post("/v1/completions", json={"model": "tiny_llama", "prompt": GOOD["text_input"],
                                                        "max_tokens": 12, "temperature": 0})
    assert reply.status_code == 200 and reply.headers["content-type"] == "application/json"
    doc = reply.json()
    assert set(doc) == {"model_name", "model_version", "text_output"}
    assert doc["model_name"] == "tiny_llama" and doc["model_version"] == "1"
    assert doc["text_output"] and doc["text_output"] == completion.json()["choices"][0]["text"]


def test_generate_stream_sends_the_same_text_piece_by_piece(genai_server: harness.ThreadedServer) -> None:
    body = {**GOOD, "return_finish_reason": True, "return_num_input_tokens": True, "return_num_output_tokens": True}
    with client(genai_server) as http:
        whole = http.post("/v2/models/tiny_llama/versions/1/generate", json=body).json()
        streamed = http.post("/v2/models/tiny_llama/generate_stream", json=body)
    assert streamed.status_code == 200
    assert streamed.headers["content-type"] == "text/event-stream; charset=utf-8"
    chunks = events(streamed)
    assert len(chunks) > 2  # pieces, not one block
    assert all(c["model_name"] == "tiny_llama" and c["model_version"] == "1" for c in chunks)
    assert "".join(c["text_output"] for c in chunks) == whole["text_output"]
    last = chunks[-1]
    assert last["finish_reason"] == whole["finish_reason"] and last["finish_reason"] in ("stop", "length")
    assert last["num_input_tokens"] == whole["num_input_tokens"] > 0
    assert last["num_output_tokens"] == whole["num_output_tokens"] <= 12
    assert all("finish_reason" not in c for c in chunks[:-1])


def test_generate_stream_with_stream_false_sends_one_event(genai_server: harness.ThreadedServer) -> None:
    body = {**GOOD, "parameters": {**GOOD["parameters"], "stream": False}}
    with client(genai_server) as http:
        whole = http.post("/v2/models/tiny_llama/generate", json=GOOD).json()
        streamed = http.post("/v2/models/tiny_llama/generate_stream", json=body)
    assert [c["text_output"] for c in events(streamed)] == [whole["text_output"]]


def test_v2_advertises_generate_and_infer_points_to_it(genai_server: harness.ThreadedServer) -> None:
    infer = {"inputs": [{"name": "input", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
    with client(genai_server) as http:
        assert "generate" in http.get("/v2").json()["extensions"]
        refused = http.post("/v2/models/tiny_llama/infer", json=infer)
    assert "POST /v2/models/tiny_llama/generate" in error_of(refused, 400)


@pytest.mark.parametrize(("body", "words"), [
    (b"{not json", "not valid JSON"),
    (b"[1]", "must be a JSON object, found list"),
    ({"parameters": {}}, "'text_input' must be a non-empty string, found nothing"),
    ({"text_input": 7}, "'text_input' must be a non-empty string, found int"),
    ({**GOOD, "inputs": []}, "unsupported field(s) inputs"),
    ({**GOOD, "parameters": []}, "'parameters' must be an object"),
    ({**GOOD, "parameters": {"beam_width": 2}}, "unsupported parameter(s) beam_width"),
    ({**GOOD, "parameters": {"temperature": "hot"}}, "'temperature' must be a number from 0.0 to 2.0"),
    ({**GOOD, "parameters": {"max_tokens": 0}}, "'max_tokens' must be an integer of at least 1"),
    ({**GOOD, "parameters": {"max_tokens": 100000}}, "max_tokens 100000 does not fit"),
    ({**GOOD, "parameters": {"stream": True}}, "stream from POST /v2/models/tiny_llama/generate_stream"),
    ({**GOOD, "parameters": {"stream": "yes"}}, "parameter 'stream' must be true or false"),
    ({**GOOD, "exclude_input_in_output": False}, "'exclude_input_in_output' can only be true"),
    ({**GOOD, "return_finish_reason": 1}, "'return_finish_reason' must be true or false"),
])
def test_bad_generate_requests_are_refused_naming_the_problem(genai_server: harness.ThreadedServer, body: Any,
                                                              words: str) -> None:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    with client(genai_server) as http:
        message = error_of(http.post("/v2/models/tiny_llama/generate", content=content), 400)
    assert words in message


def test_models_that_cannot_generate_are_refused(genai_server: harness.ThreadedServer) -> None:
    with client(genai_server) as http:
        assert "'nope'" in error_of(http.post("/v2/models/nope/generate", json=GOOD), 404)
        assert "not a generative model" in error_of(http.post("/v2/models/tiny_mlp/generate_stream", json=GOOD),
                                                    400)
        missing = http.post("/v2/models/tiny_llama/versions/7/generate", json=GOOD)
    assert missing.status_code in (400, 404) and "7" in missing.json()["error"]


def cancelled_count(server: harness.ThreadedServer) -> float:
    with client(server) as http:
        families = text_string_to_metric_families(http.get("/metrics").text)
        return sum(s.value for f in families if f.name == "edged_generation_requests" for s in f.samples
                   if s.name.endswith("_total") and s.labels.get("model") == "tiny_llama"
                   and s.labels.get("outcome") == "cancelled")


def test_hang_up_on_generate_stream_cancels_the_generation(genai_server: harness.ThreadedServer) -> None:
    assert genai_server.service is not None
    before = cancelled_count(genai_server)
    # The model's one sequence slot is held while the clients hang up, so their generations wait in line until
    # the server notices they are gone: a generation left to run (240 tokens, ~20 ms) finished before a CI run's
    # starved event loop read the FIN, and was counted completed.
    slot = genai_server.service.generation._gate("tiny_llama").running
    assert slot.acquire(timeout=30)
    try:
        body = orjson.dumps({"text_input": "Open the gate", "parameters": {"max_tokens": 240, "temperature": 0}})
        for path in (b"generate_stream", b"generate"):
            with socket.create_connection(("127.0.0.1", genai_server.port)) as sock:
                sock.sendall(b"POST /v2/models/tiny_llama/%s HTTP/1.1\r\nhost: x\r\n"
                             b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (path, len(body), body))
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + 30  # a bound on waiting for the counter, not a timed assertion
        while cancelled_count(genai_server) < before + 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cancelled_count(genai_server) == before + 2
    finally:
        slot.release()

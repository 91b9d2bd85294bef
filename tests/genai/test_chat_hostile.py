"""Hostile and unsupported requests to /v1/chat/completions get OpenAI's error JSON naming the problem, and the
server goes on serving."""

from __future__ import annotations

import contextlib
import socket
import time
from typing import Any

import httpx
import orjson
import pytest
import server_harness as harness
from prometheus_client.parser import text_string_to_metric_families

GOOD = {"model": "tiny_llama", "messages": [{"role": "user", "content": "Open the gate"}], "max_tokens": 4}
# nested a thousand deep: orjson parses it (1024 levels), json.dumps and json.loads recursed past their limit
DEEP = b'{"a":' * 1000 + b"1" + b"}" * 1000
_ASK = b'{"model": "tiny_llama", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}], '
DEEP_TOOL = _ASK + (b'"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", '
                    b'"properties": ' + DEEP + b"}}}]}")
LIST_TOOL = _ASK + (b'"tools": [{"type": "function", "function": {"name": "f", "parameters": ' + b"[" * 1000
                    + b"]" * 1000 + b"}}]}")
DEEP_FORMAT = _ASK + (b'"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": '
                      + DEEP + b"}}}")
DEEP_ARGUMENTS = orjson.dumps({**GOOD, "messages": [
    {"role": "user", "content": "x"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "[" * 100000}}]}]})


def post(server: harness.ThreadedServer, body: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    with httpx.Client(base_url=f"http://127.0.0.1:{server.port}") as http:
        return http.post("/v1/chat/completions", content=content)


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@pytest.mark.parametrize(("body", "param", "words"), [
    (b"{not json", None, "not valid JSON"),
    (b"[1, 2]", None, "JSON object"),
    ({**GOOD, "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role", "wizard"),
    ({**GOOD, "messages": [{"role": ["user"], "content": "hi"}]}, "messages[0].role", "found ['user']"),
    ({**GOOD, "messages": [{"role": {"x": 1}, "content": "hi"}]}, "messages[0].role", "must be one of"),
    (b'{"model": "tiny_llama", "messages": [{"role": ' + b"[" * 1000 + b"]" * 1000 + b', "content": "hi"}]}',
     "messages[0].role", "found [[[[...]]]]"),
    ({**GOOD, "messages": [{"role": "user", "content": "a\u0000b"}]}, "messages[0].content", "NUL character"),
    ({**GOOD, "messages": [{"role": "user", "content": [{"type": "text", "text": "\u0000"}]}]},
     "messages[0].content", "NUL character"),
    ({**GOOD, "messages": [{"role": "user", "content": "hi", "name": "a\u0000"}]}, "messages[0].name", "NUL"),
    ({**GOOD, "n": 2}, "n", "'n' must be 1"),
    ({**GOOD, "n": True}, "n", "'n' must be 1"),
    ({**GOOD, "parallel_tool_calls": False}, "parallel_tool_calls", "only beside 'tools'"),
    ({**GOOD, "tools": [{"type": "function"}]}, "tools[0]", "function tools only"),
    ({**GOOD, "logprobs": True}, "logprobs", "logprobs"),
    ({**GOOD, "temperature": 5}, "temperature", "from 0.0 to 2.0"),
    ({**GOOD, "max_tokens": 0}, "max_tokens", "at least 1"),
    ({**GOOD, "stop": ["a", "b", "c", "d", "e"]}, "stop", "up to 4"),
    ({**GOOD, "messages": []}, "messages", "non-empty"),
    (DEEP_TOOL, "tools[0].function.parameters", "more than 64 levels deep"),
    (LIST_TOOL, "tools[0].function.parameters", "found [[[[...]]]]"),
    (DEEP_FORMAT, "response_format.json_schema.schema", "more than 64 levels deep"),
    (DEEP_ARGUMENTS, "messages[1].tool_calls[0].function.arguments", "the text of a JSON object"),
    ({**GOOD, "stream_options": {"include_usage": True}}, "stream_options", "only with stream=true"),
])
def test_bad_requests_are_refused_with_the_parameter_named(genai_server: harness.ThreadedServer, body: Any,
                                                           param: str | None, words: str) -> None:
    error = error_of(post(genai_server, body), 400)
    assert error["param"] == param
    assert words in error["message"]
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("name", ["n", "stream", "parallel_tool_calls", "temperature", "seed", "stop", "max_tokens",
                                  "top_p", "tools", "tool_choice", "response_format", "stream_options", "user"])
def test_null_is_an_optional_parameter_left_out(genai_server: harness.ThreadedServer, name: str) -> None:
    # OpenAI types these "... or null"; SDKs that serialize unset fields send null
    reply = post(genai_server, {**GOOD, name: None})
    assert reply.status_code == 200, reply.text
    assert reply.json()["object"] == "chat.completion"
    completion = {"model": "tiny_llama", "prompt": "The", "max_tokens": 2, "n": None, "stream": None}
    with httpx.Client(base_url=f"http://127.0.0.1:{genai_server.port}") as http:
        assert http.post("/v1/completions", json=completion).json()["object"] == "text_completion"


def test_harmless_user_field_is_accepted(genai_server: harness.ThreadedServer) -> None:
    assert post(genai_server, {**GOOD, "user": "someone"}).status_code == 200


def test_prompt_past_the_context_is_refused(genai_server: harness.ThreadedServer) -> None:
    huge = {**GOOD, "messages": [{"role": "user", "content": "the gate " * 2000}]}
    error = error_of(post(genai_server, huge), 400)
    assert error["param"] == "messages" and "at most 256 tokens" in error["message"]
    too_long = {**GOOD, "max_tokens": 1000}
    error = error_of(post(genai_server, too_long), 400)
    assert error["param"] == "max_tokens"


def test_unknown_and_non_generative_models(genai_server: harness.ThreadedServer) -> None:
    error = error_of(post(genai_server, {**GOOD, "model": "nope"}), 404)
    assert error["code"] == "model_not_found"
    error = error_of(post(genai_server, {**GOOD, "model": "tiny_mlp"}), 400)
    assert "not a generative model" in error["message"]


def test_infer_on_a_generative_model_points_to_chat_completions(genai_server: harness.ThreadedServer) -> None:
    body = {"inputs": [{"name": "input", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
    with httpx.Client(base_url=f"http://127.0.0.1:{genai_server.port}") as http:
        response = http.post("/v2/models/tiny_llama/infer", json=body)
    assert response.status_code == 400
    assert "/v1/chat/completions" in response.json()["error"]


def generation_counts(server: harness.ThreadedServer) -> dict[str, float]:
    with httpx.Client(base_url=f"http://127.0.0.1:{server.port}") as http:
        families = text_string_to_metric_families(http.get("/metrics").text)
        return {s.labels["outcome"]: s.value for f in families if f.name == "edged_generation_requests"
                for s in f.samples if s.name.endswith("_total") and s.labels["model"] == "tiny_llama"}


def hang_up(server: harness.ThreadedServer, body: bytes, read_head: bool) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(body), body))
        head = sock.recv(65536) if read_head else b""
        with contextlib.suppress(OSError):  # the server may have closed first
            sock.shutdown(socket.SHUT_WR)
        return head


def _outcome_of_a_hang_up(server: harness.ThreadedServer, stream: bool) -> str:
    """Send the longest request the context allows and hang up at once; the outcome the server counted."""
    before = generation_counts(server)
    hang_up(server, orjson.dumps({**GOOD, "max_tokens": 230, "stream": stream}), read_head=False)
    deadline = time.monotonic() + 30  # a bound on waiting for the counters, not a timed assertion
    now = generation_counts(server)
    while sum(now.values()) <= sum(before.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
        now = generation_counts(server)
    return "cancelled" if now.get("cancelled", 0) > before.get("cancelled", 0) else "not cancelled"


def test_hang_up_cancels_the_generation(genai_server: harness.ThreadedServer) -> None:
    # The tiny model writes 230 tokens in about 20 ms: on a loaded machine the event loop may see the hang-up only
    # after the answer is complete. A broken cancel never cancels; a working one cancels within a few tries.
    for stream in (True, False):
        outcomes = []
        for _ in range(6):
            outcomes.append(_outcome_of_a_hang_up(genai_server, stream))
            if outcomes[-1] == "cancelled":
                break
        assert outcomes[-1] == "cancelled", (stream, outcomes)
    reply = post(genai_server, GOOD)
    assert reply.status_code == 200 and reply.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_a_unix_socket_client_that_closes_cancels_its_generation(genai_server: harness.ThreadedServer) -> None:
    # A Unix socket tells a closed peer from a half-closed one without a probe (POLLHUP): nothing is sent first.
    body = orjson.dumps({**GOOD, "max_tokens": 230})
    outcomes = []
    for _ in range(6):  # as in test_hang_up_cancels_the_generation: a loaded loop may see the close too late
        before = generation_counts(genai_server)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(genai_server.socket_path)
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s"
                         % (len(body), body))
        deadline = time.monotonic() + 30  # a bound on waiting for the counters, not a timed assertion
        now = generation_counts(genai_server)
        while sum(now.values()) <= sum(before.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
            now = generation_counts(genai_server)
        outcomes.append("cancelled" if now.get("cancelled", 0) > before.get("cancelled", 0) else "not cancelled")
        if outcomes[-1] == "cancelled":
            break
    assert outcomes[-1] == "cancelled", outcomes


def test_disconnect_mid_stream_leaves_the_server_serving(genai_server: harness.ThreadedServer) -> None:
    before = generation_counts(genai_server)
    body = orjson.dumps({**GOOD, "max_tokens": 230, "stream": True})
    for _ in range(3):
        assert hang_up(genai_server, body, read_head=True).startswith(b"HTTP/1.1 200 OK")
    reply = post(genai_server, GOOD)
    assert reply.status_code == 200 and reply.json()["choices"][0]["finish_reason"] in ("stop", "length")
    after = generation_counts(genai_server)
    # each stream ended cancelled or (if it outran the hang-up) completed: none failed
    assert after["failed"] == before["failed"]
    assert sum(after.values()) - sum(before.values()) == 4


def _half_close_and_read(sock: socket.socket, body: bytes) -> bytes:
    """Send a chat request, half-close (shutdown(SHUT_WR), as ``nc -N`` does), and read until the server closes
    (a keep-alive request: the server closes once it owes nothing, since no further request can come)."""
    sock.settimeout(30)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                 b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
    sock.shutdown(socket.SHUT_WR)
    received = b""
    while piece := sock.recv(65536):
        received += piece
    return received


@pytest.mark.parametrize("over", ["tcp", "uds"])
def test_a_client_that_half_closes_and_reads_gets_its_answer(genai_server: harness.ThreadedServer,
                                                            over: str) -> None:
    # HTTP/1.1 lets a client half-close while it waits; the FIN once cancelled its generation, so it got nothing.
    def connect() -> socket.socket:
        if over == "tcp":
            return socket.create_connection(("127.0.0.1", genai_server.port))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(genai_server.socket_path)
        return sock

    before = generation_counts(genai_server)
    with connect() as sock:
        answer = _without_interim(_half_close_and_read(sock, orjson.dumps({**GOOD, "max_tokens": 16})), over)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer[:200]
    reply = orjson.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert reply["choices"][0]["finish_reason"] in ("stop", "length")
    with connect() as sock:
        streamed = _half_close_and_read(sock, orjson.dumps({**GOOD, "max_tokens": 16, "stream": True}))
    streamed = _without_interim(streamed, over)
    assert streamed.startswith(b"HTTP/1.1 200 OK\r\n"), streamed[:200]
    assert streamed.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"), streamed[-200:]
    after = generation_counts(genai_server)
    assert after.get("cancelled", 0) == before.get("cancelled", 0)


def _without_interim(answer: bytes, over: str) -> bytes:
    """Over TCP a FIN before the answer began gets an interim 100 Continue: a client that closed its socket would
    answer it with a reset. A Unix socket tells a close from a half-close by itself."""
    interim = b"HTTP/1.1 100 Continue\r\n\r\n"
    if over == "tcp" and answer.startswith(interim):
        return answer[len(interim):]
    return answer


def test_a_64_bit_seed_is_taken(genai_server: harness.ThreadedServer) -> None:
    # OpenAI's seeds are 64-bit; ORT GenAI takes an int32, and 2**31 and above failed its cast: a 500
    for seed in (2**31, 2**64 - 1, -(2**63)):
        reply = post(genai_server, {**GOOD, "seed": seed, "temperature": 1.0})
        assert reply.status_code == 200, reply.text
    for bad in (b"1.5", b"18446744073709551616", b'"7"'):  # 2**64 is parsed as a float
        body = orjson.dumps(GOOD)[:-1] + b', "seed": ' + bad + b"}"
        assert error_of(post(genai_server, body), 400)["param"] == "seed"


@pytest.mark.parametrize("name", ["n", "temperature", "max_tokens", "seed", "stream"])
def test_a_parameter_nested_a_thousand_deep_is_a_400_naming_it(genai_server: harness.ThreadedServer,
                                                               name: str) -> None:
    # the refusal's message showed the value with repr, which recursed past its limit: a 500
    body = orjson.dumps(GOOD)[:-1] + b', "' + name.encode() + b'": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    error = error_of(post(genai_server, body), 400)
    assert error["param"] == name and "[[[[...]]]]" in error["message"]
    with httpx.Client(base_url=f"http://127.0.0.1:{genai_server.port}") as http:
        generate = http.post("/v2/models/tiny_llama/generate",
                             content=b'{"text_input": "a", "parameters": {"stream": ' + b"[" * 1000 + b"]" * 1000
                             + b"}}")
    assert generate.status_code == 400 and "[[[[...]]]]" in generate.json()["error"]

"""What a request gets when handling it raised an unexpected exception (`edged.serving._sse.failure`, used by
`Responder.fail`): a 500 in its API's shape, OpenAI's error JSON under /v1; once a /v1 stream has begun, an SSE
error event and the stream's proper end, never a status line in the middle of the chunked body. Read back with
httptools, the parser the server itself uses, and checked as OpenAI's client reads it."""

from __future__ import annotations

from typing import Any

import httptools
import orjson
import pytest

from edged.serving._sse import chunk_event, failure

STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


class _Read:
    """One HTTP response parsed: status, body, and whether it ended as a complete message."""

    def __init__(self, data: bytes) -> None:
        self.body = b""
        self.complete = False
        parser = httptools.HttpResponseParser(self)
        parser.feed_data(data)
        self.status = parser.get_status_code()
        self.keep_alive = parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


def _openai_error(doc: Any) -> dict[str, Any]:
    error: dict[str, Any] = doc["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "server_error" and "RuntimeError" in error["message"]
    return error


@pytest.mark.parametrize("keep_alive", [True, False])
def test_a_failure_under_v1_is_openais_500(keep_alive: bool) -> None:
    data, close = failure(b"/v1/chat/completions", RuntimeError("x"), begun=False, keep_alive=keep_alive)
    read = _Read(data)
    assert read.complete and read.status == 500 and close is not keep_alive
    _openai_error(orjson.loads(read.body))  # it was Triton's {"error": "..."}, unreadable to OpenAI's clients


def test_a_failure_elsewhere_keeps_tritons_shape() -> None:
    data, _ = failure(b"/v2/models/m/infer", RuntimeError("x"), begun=False, keep_alive=True)
    read = _Read(data)
    assert read.status == 500 and isinstance(orjson.loads(read.body)["error"], str)


def test_a_failure_in_the_middle_of_a_v1_stream_ends_it_with_an_error_event() -> None:
    # it was a whole "HTTP/1.1 500" response written inside the chunked body: "illegal chunk header" to httpx
    first = chunk_event({"choices": [{"delta": {"content": "Open"}}]})
    tail, close = failure(b"/v1/chat/completions", RuntimeError("x"), begun=True, keep_alive=True)
    read = _Read(STREAM_HEAD + first + tail)
    assert read.complete and read.status == 200 and not close, "the body ends properly; the connection lives on"
    events = [e.removeprefix(b"data: ") for e in read.body.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]"
    assert "error" not in orjson.loads(events[0])
    _openai_error(orjson.loads(events[1]))  # OpenAI's client raises an APIError with its message


def test_a_failure_in_the_middle_of_another_stream_closes_the_connection() -> None:
    tail, close = failure(b"/v2/models/m/generate_stream", RuntimeError("x"), begun=True, keep_alive=True)
    assert tail == b"" and close, "an unterminated body is an incomplete response to the client"

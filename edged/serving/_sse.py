"""Server-Sent Events over chunked transfer encoding, as the /v1 streams send them, and the answer a request gets
when handling it failed unexpectedly (`failure`), before or after its stream began.

A stream that has begun cannot take a status line any more: a 500 written there is bytes in the middle of the
chunked body that the client's parser reads as garbage. Under /v1 it gets OpenAI's error JSON as one more
event, then ``[DONE]`` and the body's last chunk, which OpenAI's clients raise as an APIError; elsewhere the
connection is closed with the body unterminated, which an HTTP client reports as an incomplete response.
"""

from __future__ import annotations

from typing import Any

import orjson

from edged.serving._openai import openai_error_response
from edged.serving._response import error_response, render
from edged.serving._routes import is_openai_url

DONE = b"data: [DONE]\n\n"
END = b"%x\r\n%s\r\n0\r\n\r\n" % (len(DONE), DONE)  # the [DONE] event and the chunked body's last chunk


def chunk_event(doc: Any) -> bytes:
    """One ``data:`` event holding ``doc``, framed as one chunk."""
    event = b"data: " + orjson.dumps(doc) + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


def failure(url: bytes, error: BaseException, begun: bool, keep_alive: bool) -> tuple[bytes, bool]:
    """(bytes, close) answering a request to ``url`` whose handling raised ``error``, an unexpected exception
    (its traceback is logged by the caller): a 500 in the shape of the route's API, or, once the response has
    ``begun``, the end of its stream."""
    message = f"internal server error: {type(error).__name__} (logged by the server)"
    openai = is_openai_url(url)
    if begun:
        if not openai:
            return b"", True
        return chunk_event(orjson.loads(openai_error_response(500, message).body)) + END, not keep_alive
    response = openai_error_response(500, message) if openai else error_response(500, message)
    return render(response, keep_alive), not keep_alive

"""``GET /v1/models[/{model}]``, ``POST /v1/chat/completions`` and ``POST /v1/completions``: OpenAI's HTTP and SSE
shapes over the engine's `GenerationService` (engine/generation.py), which does the work in its own threads.

Invariants: nothing blocking runs on the event loop (the stream delivers each batch of waiting events to a
callback on the loop, written in one socket write); every error before the first streamed byte is OpenAI's error JSON
with its status, after it an SSE ``error`` event; a client that disconnects cancels its generation (the
connection calls the slot's ``cancel``, and a write to a closed connection does the same), and the generator
stops before its next token.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson

from edged.engine import InferenceService
from edged.engine.generation import GenerationRequest, GenerationService
from edged.engine.generation_stream import Finished, GenerationEvent, GenerationStream, Started, TextDelta
from edged.errors import EdgedError, ModelNotFound
from edged.exposition import MetricFamily
from edged.serving._http import Connection, Incoming, Slot
from edged.serving._openai import (
    ChatRequest,
    call_deltas,
    chat_completion,
    chunk,
    completion_id,
    model_object,
    openai_calls,
    openai_error,
    parse_chat,
    parse_completion,
    text_completion,
    usage,
)
from edged.serving._response import Response, json_response, render
from edged.serving._sse import END, chunk_event

log = logging.getLogger(__name__)

_SSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
             b"transfer-encoding: chunked\r\n")
_MARK = "\ue000edged-text\ue000"  # private-use characters: in no model name or completion id


def generation_request(request: ChatRequest) -> GenerationRequest:
    return GenerationRequest(request.model, request.messages, request.prompt, request.tools, request.max_tokens,
                             request.temperature, request.top_p, request.top_k, request.seed, request.stop,
                             request.response_format, request.max_tokens_field)


class ChatPath:
    def __init__(self, service: InferenceService) -> None:
        self._generation: GenerationService = service.generation
        self._loop = asyncio.get_running_loop()

    def models(self) -> Response:
        data = [model_object(name, created) for name, created in self._generation.ready_generative().items()]
        return json_response({"object": "list", "data": data})

    def model(self, name: str) -> Response:
        """``GET /v1/models/{model}``: the model as ``GET /v1/models`` lists it, else 404 ``model_not_found``."""
        created = self._generation.ready_generative().get(name)
        if created is None:
            return openai_error(ModelNotFound(f"model {name!r} is not a ready generative model of this server "
                                              "(GET /v1/models lists them)"))
        return json_response(model_object(name, created))

    def handle(self, connection: Connection, incoming: Incoming, slot: Slot, chat: bool = True) -> None:
        """``chat``: /v1/chat/completions, else /v1/completions (a prompt string, no chat template)."""
        try:
            request = parse_chat(incoming.body) if chat else parse_completion(incoming.body)
            answer = _Answer(connection, incoming, slot, request)
            answer.stream = self._generation.submit(generation_request(request), (self._loop, answer.deliver))
        except EdgedError as e:
            connection.respond(slot, render(openai_error(e), incoming.keep_alive), not incoming.keep_alive)
            return
        slot.cancel = answer.stream.cancel

    def metric_families(self) -> list[MetricFamily]:
        return self._generation.metric_families()


class _Answer:
    """One request's answer, written on the event loop as its events arrive."""

    stream: GenerationStream  # set once submitted; batches are delivered on the loop, so never before that

    def __init__(self, connection: Connection, incoming: Incoming, slot: Slot, request: ChatRequest) -> None:
        self._connection = connection
        self._keep_alive = incoming.keep_alive
        self._slot = slot
        self._request = request
        self._chat = request.prompt is None
        self._id = completion_id(self._chat)
        self._streaming = False
        self._parts: list[str] = []
        self._frame: tuple[bytes, bytes] | None = None  # a text chunk's bytes before and after its text

    def deliver(self, batch: list[GenerationEvent], error: BaseException | None) -> None:
        """A batch of events on the event loop: written in one socket write; ``error`` ends the answer."""
        try:
            self._deliver(batch, error)
        except Exception as e:  # a callback on the loop: unanswered, the client would wait forever
            self.stream.cancel()
            # OpenAI's 500, or once streaming an error event and the stream's proper end (not a status line
            # in the middle of the chunked body)
            self._connection.fail(self._slot, e, self._keep_alive)

    def _deliver(self, batch: list[GenerationEvent], error: BaseException | None) -> None:
        parts: list[bytes] = []
        run: list[str] = []  # the text of consecutive deltas, streamed as one SSE event
        for event in batch:
            if isinstance(event, TextDelta) and self._streaming:
                run.append(event.text)
                continue
            if run:
                parts.append(self._text_event("".join(run)))
                run.clear()
            parts.append(self._event(event))
        if run:
            parts.append(self._text_event("".join(run)))
        data = b"".join(parts)
        if error is not None:  # what stopped the generation; the engine logged an unexpected one
            if data:
                self._connection.stream(self._slot, data)
            self._fail(error)
        elif batch and isinstance(batch[-1], Finished):
            self._finish(data, batch[-1])
        elif data and not self._connection.stream(self._slot, data):
            self.stream.cancel()

    def _text_event(self, text: str) -> bytes:
        """One streamed text chunk: the request's chunk JSON rendered once, only the text encoded per chunk."""
        if self._frame is None:
            before, after = chunk_event(self._chunk(_MARK, None)).split(orjson.dumps(_MARK))
            self._frame = (before.split(b"\r\n", 1)[1], after[:-2])  # without the chunked-encoding frame
        event = self._frame[0] + orjson.dumps(text) + self._frame[1]
        return b"%x\r\n%s\r\n" % (len(event), event)

    def _event(self, event: GenerationEvent) -> bytes:
        if isinstance(event, TextDelta):
            if self._streaming:
                return self._text_event(event.text)
            self._parts.append(event.text)
        elif isinstance(event, Started) and self._request.stream:
            self._streaming = True
            head = _SSE_HEAD + (b"\r\n" if self._keep_alive else b"connection: close\r\n\r\n")
            if self._chat:
                head += chunk_event(self._usage_null(chunk(self._id, self._request.model,
                                                           {"role": "assistant", "content": ""}, None)))
            return head
        return b""

    def _finish(self, data: bytes, finished: Finished) -> None:
        request = self._request
        if finished.reason == "cancelled":
            self._connection.respond(self._slot, b"", True)
            return
        tokens = finished.usage
        calls = openai_calls(finished.tool_calls)
        if not self._streaming:
            text = "".join(self._parts)
            if self._chat:
                doc = chat_completion(self._id, request.model, text, finished.reason, tokens.prompt_tokens,
                                      tokens.completion_tokens, calls)
            else:
                doc = {**text_completion(self._id, request.model, text, finished.reason),
                       "usage": usage(tokens.prompt_tokens, tokens.completion_tokens)}
            self._answer(json_response(doc))
            return
        for delta in call_deltas(calls):
            data += chunk_event(self._usage_null(chunk(self._id, request.model, delta, None)))
        data += chunk_event(self._chunk("", finished.reason))
        if request.include_usage:
            data += chunk_event({**self._chunk("", None), "choices": [],
                                 "usage": usage(tokens.prompt_tokens, tokens.completion_tokens)})
        self._end(data)

    def _chunk(self, text: str, finish: str | None) -> dict[str, Any]:
        if self._chat:
            return self._usage_null(chunk(self._id, self._request.model, {"content": text} if text else {}, finish))
        return self._usage_null(text_completion(self._id, self._request.model, text, finish))

    def _usage_null(self, doc: dict[str, Any]) -> dict[str, Any]:
        """With ``include_usage`` every chunk but the last carries ``"usage": null``, as OpenAI sends them."""
        if self._request.include_usage:
            doc["usage"] = None
        return doc

    def _fail(self, error: BaseException) -> None:
        if not self._streaming:
            self._answer(openai_error(error))
            return
        body = orjson.loads(openai_error(error).body)
        self._end(chunk_event(body))

    def _end(self, tail: bytes) -> None:
        self._connection.respond(self._slot, tail + END, not self._keep_alive)

    def _answer(self, response: Response) -> None:
        data = render(response, self._keep_alive)
        self._connection.respond(self._slot, data, response.close or not self._keep_alive)

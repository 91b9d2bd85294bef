"""Triton's generate extension: ``POST /v2/models/{m}[/versions/{v}]/generate`` and ``.../generate_stream``, over
the engine's `GenerationService` (engine/generation.py).

The request is Triton's ``{"text_input": str, "parameters": {...}}``; ``text_input`` is the prompt as given (no
chat template: that is what /v1/chat/completions is for). Parameters: ``max_tokens`` (default 16, as Triton's
vLLM backend), ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop`` and ``stream``, checked by the same rules
as OpenAI's /v1/completions; every other parameter or top-level field is refused with a 400 naming it, except the
vLLM backend's switches for additional outputs (``return_finish_reason``, ``return_num_input_tokens``,
``return_num_output_tokens``, and ``exclude_input_in_output``, which must be true: edged never echoes the prompt).

Answers: ``/generate`` one ``{"model_name", "model_version", "text_output"}`` object (``stream: true`` is refused
there and points to ``/generate_stream``); ``/generate_stream`` Server-Sent Events, one such object per piece of
text as it is generated (``stream: false`` sends the whole text as one event, as Triton does), the switched-on
outputs in the last event. An error before the first event is Triton's ``{"error": ...}`` JSON with its status,
after it a ``data: {"error": ...}`` event; a client that disconnects cancels its generation.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson

from edged.engine import InferenceService
from edged.engine.generation import GenerationService
from edged.engine.generation_stream import Finished, GenerationStream, Started, TextDelta
from edged.errors import EdgedError, InvalidInput
from edged.serving._chat import generation_request
from edged.serving._http import Connection, Incoming, Slot
from edged.serving._openai import ChatRequest, completion_request
from edged.serving._response import error_for, error_response, json_response, render
from edged.serving._tools import shown

GENERATE_PARAMETERS = frozenset({"max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream"})
OUTPUT_SWITCHES = frozenset({"return_finish_reason", "return_num_input_tokens", "return_num_output_tokens"})
_FIELDS = frozenset({"text_input", "parameters", "exclude_input_in_output"}) | OUTPUT_SWITCHES
_SSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ncache-control: no-cache\r\n"
             b"transfer-encoding: chunked\r\n")


@dataclass(frozen=True)
class GenerateRequest:
    request: ChatRequest  # the prompt and sampling, as /v1/completions reads them
    outputs: frozenset[str]  # the switched-on additional outputs, by their switch's name
    stream_route: bool  # /generate_stream (Server-Sent Events), else /generate (one JSON object)


def parse_generate(body: bytes | bytearray, model: str, stream_route: bool) -> GenerateRequest:
    """The request of one generate call; ``stream_route``: it came to ``/generate_stream``."""
    doc = _object(body)
    unknown = sorted(set(doc) - _FIELDS)
    if unknown:
        raise InvalidInput(f"unsupported field(s) {', '.join(unknown)}: the generate extension takes text_input "
                           f"and parameters (and the switches {', '.join(sorted(OUTPUT_SWITCHES))})")
    text = doc.get("text_input")
    if not isinstance(text, str) or not text:
        raise InvalidInput(f"'text_input' must be a non-empty string, found {_kind(text)}")
    if doc.get("exclude_input_in_output", True) is not True:
        raise InvalidInput("'exclude_input_in_output' can only be true: text_output never repeats the prompt")
    outputs = frozenset(name for name in OUTPUT_SWITCHES if _switch(doc, name))
    parameters = doc.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidInput(f"'parameters' must be an object of name/value pairs, found {_kind(parameters)}")
    unknown = sorted(set(parameters) - GENERATE_PARAMETERS)
    if unknown:
        raise InvalidInput(f"unsupported parameter(s) {', '.join(unknown)}: edged's generate takes "
                           f"{', '.join(sorted(GENERATE_PARAMETERS))}")
    stream = parameters.get("stream", stream_route)
    if not isinstance(stream, bool):
        raise InvalidInput(f"parameter 'stream' must be true or false, found {shown(stream)}")
    if stream and not stream_route:
        raise InvalidInput(f"parameter 'stream' is true: stream from POST /v2/models/{model}/generate_stream")
    # One set of rules for sampling parameters: the completion parser's, under the same names.
    completion = {"model": model, "prompt": text, **parameters, "stream": stream}
    return GenerateRequest(completion_request(completion), outputs, stream_route)


def _object(body: bytes | bytearray) -> dict[str, Any]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise InvalidInput(f"the request body is not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise InvalidInput(f"the request body must be a JSON object, found {_kind(doc)}")
    return doc


def _switch(doc: dict[str, Any], name: str) -> bool:
    value = doc.get(name, False)
    if not isinstance(value, bool):
        raise InvalidInput(f"'{name}' must be true or false, found {shown(value)}")
    return value


def _kind(value: Any) -> str:
    return "nothing" if value is None else repr(value) if isinstance(value, str) else type(value).__name__


class GeneratePath:
    def __init__(self, service: InferenceService) -> None:
        self._service = service
        self._generation: GenerationService = service.generation
        self._tasks: set[asyncio.Task[None]] = set()  # strong references: the loop keeps only weak ones

    def handle(self, connection: Connection, incoming: Incoming, slot: Slot, model: str, version: str,
               stream_route: bool) -> None:
        try:
            served = self._served_version(model, version)
            parsed = parse_generate(incoming.body, model, stream_route)
            stream = self._generation.submit(generation_request(parsed.request))
        except EdgedError as e:
            connection.respond(slot, render(error_for(e), incoming.keep_alive), not incoming.keep_alive)
            return
        slot.cancel = stream.cancel
        answer = _Answer(connection, incoming, slot, model, served, parsed, stream)
        task = asyncio.ensure_future(answer.run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _served_version(self, model: str, version: str) -> str:
        """The version that generates; a named version must be it (a generative model serves one)."""
        self._generation.instance(model)  # unknown or not generative: the same errors as /v1 gives
        served = self._service.version_info(model).version_str
        if version and self._service.version_info(model, version).version_str != served:
            raise InvalidInput(f"model {model!r} generates with version {served}, not {version}")
        return served


class _Answer:
    """One request's answer, written on the event loop as its events arrive."""

    def __init__(self, connection: Connection, incoming: Incoming, slot: Slot, model: str, version: str,
                 parsed: GenerateRequest, stream: GenerationStream) -> None:
        self._connection = connection
        self._keep_alive = incoming.keep_alive
        self._slot = slot
        self._head = {"model_name": model, "model_version": version}
        self._parsed = parsed
        self._stream = stream
        self._incremental = parsed.request.stream  # each piece of text leaves as it comes; else it is gathered
        self._started = False  # the SSE head went out: errors now travel as events
        self._parts: list[str] = []

    async def run(self) -> None:
        try:
            async for batch in self._stream.batches():
                data = b"".join(self._event(event) for event in batch)
                last = batch[-1]
                if isinstance(last, Finished):
                    self._finish(data, last)
                elif data and not self._connection.stream(self._slot, data):
                    self._stream.cancel()
        except Exception as e:  # the stream re-raises what stopped the generation; the engine logged the unexpected
            self._fail(e)

    def _event(self, event: Started | TextDelta | Finished) -> bytes:
        if isinstance(event, Started) and self._incremental:
            return self._sse_head()
        if isinstance(event, TextDelta):
            if self._incremental:
                return _sse({**self._head, "text_output": event.text})
            self._parts.append(event.text)
        return b""

    def _sse_head(self) -> bytes:
        self._started = True
        return _SSE_HEAD + (b"\r\n" if self._keep_alive else b"connection: close\r\n\r\n")

    def _finish(self, data: bytes, finished: Finished) -> None:
        if finished.reason == "cancelled":
            self._connection.respond(self._slot, b"", True)
            return
        extra = self._outputs(finished)
        if not self._parsed.stream_route:
            response = json_response({**self._head, "text_output": "".join(self._parts), **extra})
            self._connection.respond(self._slot, render(response, self._keep_alive), not self._keep_alive)
        elif not self._incremental:  # generate_stream with stream false: the whole text in one event
            self._end(self._sse_head() + _sse({**self._head, "text_output": "".join(self._parts), **extra}))
        else:
            self._end(data + (_sse({**self._head, "text_output": "", **extra}) if extra else b""))

    def _outputs(self, finished: Finished) -> dict[str, Any]:
        values = {"return_finish_reason": ("finish_reason", finished.reason),
                  "return_num_input_tokens": ("num_input_tokens", finished.usage.prompt_tokens),
                  "return_num_output_tokens": ("num_output_tokens", finished.usage.completion_tokens)}
        return dict(values[name] for name in sorted(self._parsed.outputs))

    def _fail(self, error: BaseException) -> None:
        known = isinstance(error, EdgedError)
        if not self._started:
            response = error_for(error) if known else error_response(500, f"internal error: {type(error).__name__}")
            self._connection.respond(self._slot, render(response, self._keep_alive), not self._keep_alive)
            return
        self._end(_sse({"error": str(error) if known else f"internal error: {type(error).__name__}"}))

    def _end(self, tail: bytes) -> None:
        self._connection.respond(self._slot, tail + b"0\r\n\r\n", not self._keep_alive)


def _sse(doc: dict[str, Any]) -> bytes:
    event = b"data: " + orjson.dumps(doc) + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)

"""``GET /v1/models``, ``POST /v1/chat/completions`` and ``POST /v1/completions``: generation in worker
threads, answered on the loop.

Invariants: nothing blocking runs on the event loop (loading, templating, tokenizing and generating happen in a
worker thread per request, which hands results to the loop with ``call_soon_threadsafe``); a model generates
one sequence at a time (this slice runs no batched sequences) and at most ``MAX_WAITING`` requests per model
wait behind it, past which a request gets 429 at once; every error before the first streamed byte is OpenAI's
error JSON with its status, after it an SSE ``error`` event; a client that disconnects cancels its generation
(the connection calls the slot's ``cancel``), and the generator stops before its next token.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import orjson

from edged.backends import GenerativeInstance, Sampling
from edged.engine import InferenceService
from edged.errors import EdgedError, InvalidInput, ModelNotFound, QueueFull
from edged.exposition import MetricFamily
from edged.serving._http import Connection, Incoming, Slot
from edged.serving._openai import (
    ChatRequest,
    chat_completion,
    chunk,
    completion_id,
    openai_error,
    parse_chat,
    parse_completion,
    text_completion,
    usage,
)
from edged.serving._response import Response, json_response, render
from edged.serving._tool_output import ToolOutput, call_deltas, guidance
from edged.serving._tools import ParamError

log = logging.getLogger(__name__)

GENAI_RUNTIME = "onnxruntime_genai"
MAX_WAITING = 8  # requests per model queued behind the one generating
OUTCOMES = ("completed", "cancelled", "refused", "failed")
_SSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
             b"transfer-encoding: chunked\r\n")
_DONE = b"data: [DONE]\n\n"


class _Gate:
    """One generation at a time per model, with a bounded line of waiting requests."""

    def __init__(self) -> None:
        self.running = threading.Lock()
        self._count = threading.Lock()
        self.admitted = 0  # generating plus waiting
        # since start, for /metrics: requests by outcome, and tokens read and generated
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.prompt_tokens = 0
        self.output_tokens = 0

    def record(self, outcome: str, prompt_tokens: int = 0, output_tokens: int = 0) -> None:
        with self._count:
            self.outcomes[outcome] += 1
            self.prompt_tokens += prompt_tokens
            self.output_tokens += output_tokens

    def admit(self, model: str) -> None:
        with self._count:
            if self.admitted > MAX_WAITING:
                raise QueueFull(f"model {model!r} is generating and {MAX_WAITING} requests wait for it; "
                                "retry later")
            self.admitted += 1

    def leave(self) -> None:
        with self._count:
            self.admitted -= 1


class _StopText:
    """Cuts the output at the first stop string, holding back a tail that could be the start of one."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = stops
        self._hold = max((len(s) for s in stops), default=1) - 1
        self._text = ""

    def feed(self, text: str) -> tuple[str, bool]:
        self._text += text
        found = [i for i in (self._text.find(s) for s in self._stops) if i >= 0]
        if found:
            out, self._text = self._text[:min(found)], ""
            return out, True
        cut = len(self._text) - self._hold
        out, self._text = self._text[:cut], self._text[cut:]
        return out, False

    def flush(self) -> str:
        out, self._text = self._text, ""
        return out


def _chunk_bytes(doc: Any) -> bytes:
    event = b"data: " + orjson.dumps(doc) + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


class ChatPath:
    def __init__(self, service: InferenceService) -> None:
        self._service = service
        self._loop = asyncio.get_running_loop()
        self._gates: dict[str, _Gate] = {}

    def models(self) -> Response:
        data = [{"id": entry["name"], "object": "model", "created": 0, "owned_by": "edged"}
                for entry in self._service.repository_index(ready_only=True)
                if self._service.model_config(entry["name"]).runtime == GENAI_RUNTIME]
        return json_response({"object": "list", "data": data})

    def handle(self, connection: Connection, incoming: Incoming, slot: Slot, chat: bool = True) -> None:
        """``chat``: /v1/chat/completions, else /v1/completions (a prompt string, no chat template)."""
        try:
            request = parse_chat(incoming.body) if chat else parse_completion(incoming.body)
            gate = self._gate(request.model)
            gate.admit(request.model)
        except EdgedError as e:
            connection.respond(slot, render(openai_error(e), incoming.keep_alive), not incoming.keep_alive)
            return
        cancelled = threading.Event()
        slot.cancel = cancelled.set
        worker = _Generation(self, connection, incoming, slot, request, cancelled)
        threading.Thread(target=worker.run, args=(gate,), name=f"generate-{request.model}", daemon=True).start()

    def _gate(self, model: str) -> _Gate:
        gate = self._gates.get(model)
        if gate is None:
            # only models of the repository get a gate: a client cycling through names cannot grow the table
            if model not in self._service.model_names():
                raise ModelNotFound(f"model {model!r} is not in the repository (see GET /v1/models)")
            gate = self._gates[model] = _Gate()
        return gate

    def metric_families(self) -> list[MetricFamily]:
        requests = MetricFamily("edged_generation_requests_total", "counter",
                                "Chat completion requests per generative model, by outcome.")
        waiting = MetricFamily("edged_generation_requests_admitted", "gauge",
                               "Chat completion requests generating or waiting, per model.")
        prompt = MetricFamily("edged_generation_prompt_tokens_total", "counter", "Prompt tokens read, per model.")
        output = MetricFamily("edged_generation_output_tokens_total", "counter", "Tokens generated, per model.")
        for model, gate in sorted(self._gates.items()):
            for outcome, count in gate.outcomes.items():
                requests.add(count, {"model": model, "outcome": outcome})
            waiting.add(gate.admitted, {"model": model})
            prompt.add(gate.prompt_tokens, {"model": model})
            output.add(gate.output_tokens, {"model": model})
        return [requests, waiting, prompt, output]

    def instance(self, model: str) -> GenerativeInstance:
        """The ready generative instance of ``model``, loading a lazily loaded model first (blocking)."""
        if model not in self._service.model_names():
            raise ModelNotFound(f"model {model!r} is not in the repository (see GET /v1/models)")
        self._service.ensure_loaded(model)
        version = self._service.version_info(model)
        instance = version.instances[0] if version.instances else None
        if not isinstance(instance, GenerativeInstance):
            raise ParamError(f"model {model!r} is not a generative model (backend {version.config.runtime!r}); "
                             f"chat completions need backend {GENAI_RUNTIME!r}", "model")
        return instance

    def call(self, callback: Any, *args: Any) -> None:
        self._loop.call_soon_threadsafe(callback, *args)


class _Generation:
    """One request's work in its worker thread."""

    def __init__(self, path: ChatPath, connection: Connection, incoming: Incoming, slot: Slot,
                 request: ChatRequest, cancelled: threading.Event) -> None:
        self._path = path
        self._connection = connection
        self._keep_alive = incoming.keep_alive
        self._slot = slot
        self._request = request
        self._cancelled = cancelled
        self._chat = request.prompt is None
        self._id = completion_id(self._chat)
        self._streaming = False
        self._tools: ToolOutput | None = None

    def run(self, gate: _Gate) -> None:
        try:
            instance = self._path.instance(self._request.model)
            prompt, sampling = self._prepare(instance)
            with gate.running:
                count = self._generate(instance, prompt, sampling)
                gate.record("cancelled" if self._cancelled.is_set() else "completed", len(prompt), count)
        except EdgedError as e:
            gate.record("refused")
            self._fail(e)
        except Exception as e:  # a worker thread: an escaping error would leave the request unanswered
            log.error("generation failed for model %s", self._request.model, exc_info=e)
            gate.record("failed")
            self._fail(e)
        finally:
            gate.leave()

    def _prepare(self, instance: GenerativeInstance) -> tuple[list[int], Sampling]:
        request = self._request
        text = request.prompt
        tools = request.tools
        if tools.active and instance.tool_parser is None:
            raise ParamError(f"model {request.model!r} takes no tools: its config sets no parameters.tool_parser "
                             "(how its output writes tool calls)", "tools")
        if text is None:
            text = instance.render_chat(request.messages, list(tools.definitions) if tools.active else None,
                                        add_generation_prompt=True)
        prompt = instance.encode(text)
        room = instance.context_length - len(prompt)
        if room <= 0:
            raise ParamError(f"the prompt is {len(prompt)} tokens; model {request.model!r} takes at most "
                             f"{instance.context_length} tokens of prompt and output together", "messages")
        if request.max_tokens is not None and request.max_tokens > room:
            raise ParamError(f"max_tokens {request.max_tokens} does not fit: the prompt is {len(prompt)} tokens "
                             f"and model {request.model!r} takes {instance.context_length} in all", "max_tokens")
        self._tools = ToolOutput(tools, instance.tool_parser)
        sampling = Sampling(request.max_tokens or room, request.temperature, request.top_p, request.top_k,
                            request.seed, guidance(tools, request.response_format, instance.tool_parser))
        return prompt, sampling

    def _generate(self, instance: GenerativeInstance, prompt: list[int], sampling: Sampling) -> int:
        """Generate and answer; the number of tokens generated."""
        request = self._request
        try:
            tokens = instance.generate(prompt, sampling, self._cancelled)
        except InvalidInput as e:  # the grammar: from response_format, or from the tools a call must match
            param = "response_format" if request.response_format is not None else "tools"
            raise ParamError(str(e), param) from e
        if request.stream:
            self._streaming = True
            head = _SSE_HEAD + (b"\r\n" if self._keep_alive else b"connection: close\r\n\r\n")
            if self._chat:
                head += _chunk_bytes(chunk(self._id, request.model, {"role": "assistant", "content": ""}, None))
            self._send(head)
        stop = _StopText(request.stop)
        parts: list[str] = []
        count = 0
        stopped = False
        for token in tokens:
            count += 1
            text, stopped = stop.feed(token.text)
            self._emit(text, parts)
            if stopped:
                break
        if self._cancelled.is_set():
            self._path.call(self._connection.respond, self._slot, b"", True)
            return count
        if not stopped:
            self._emit(stop.flush(), parts)
        finish = "stop" if stopped or count < sampling.max_new_tokens else "length"
        rest, calls = self._tools.finish() if self._tools is not None else ("", [])
        self._emit(rest, parts, held=False)
        if calls:
            finish = "tool_calls"
            for delta in call_deltas(calls) if self._streaming else ():
                self._send(_chunk_bytes(chunk(self._id, request.model, delta, None)))
        self._finish("".join(parts), finish, len(prompt), count, calls)
        return count

    def _emit(self, text: str, parts: list[str], held: bool = True) -> None:
        if held and self._tools is not None:
            text = self._tools.feed(text)
        if not text:
            return
        if self._streaming:
            self._send(_chunk_bytes(self._chunk(text, None)))
        else:
            parts.append(text)

    def _finish(self, text: str, finish: str, prompt_tokens: int, count: int,
                calls: list[dict[str, Any]]) -> None:
        request = self._request
        if not self._streaming:
            if self._chat:
                doc = chat_completion(self._id, request.model, text, finish, prompt_tokens, count, calls)
            else:
                doc = {**text_completion(self._id, request.model, text, finish),
                       "usage": usage(prompt_tokens, count)}
            self._answer(json_response(doc))
            return
        tail = _chunk_bytes(self._chunk("", finish))
        if request.include_usage:
            tail += _chunk_bytes({**self._chunk("", None), "choices": [], "usage": usage(prompt_tokens, count)})
        self._end(tail)

    def _chunk(self, text: str, finish: str | None) -> dict[str, Any]:
        if self._chat:
            return chunk(self._id, self._request.model, {"content": text} if text else {}, finish)
        return text_completion(self._id, self._request.model, text, finish)

    def _fail(self, error: BaseException) -> None:
        if not self._streaming:
            self._answer(openai_error(error))
            return
        body = orjson.loads(openai_error(error).body)
        self._end(_chunk_bytes(body))

    def _end(self, tail: bytes) -> None:
        event = _DONE
        data = tail + b"%x\r\n%s\r\n0\r\n\r\n" % (len(event), event)
        self._path.call(self._connection.respond, self._slot, data, not self._keep_alive)

    def _answer(self, response: Response) -> None:
        data = render(response, self._keep_alive)
        self._path.call(self._connection.respond, self._slot, data, response.close or not self._keep_alive)

    def _send(self, data: bytes) -> None:
        self._path.call(self._write, data)
        # Hand the GIL to the event loop now: otherwise the loop, woken to write this chunk, waits for the
        # interpreter's switch interval (5 ms) while this thread generates on, and tokens leave in bursts.
        time.sleep(0)

    def _write(self, data: bytes) -> None:
        if not self._connection.stream(self._slot, data):
            self._cancelled.set()


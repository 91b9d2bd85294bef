"""`GenerationService`: text generation by generative models for every front end (HTTP, MQTT), with no transport.

``submit(request)`` checks admission at once (an unknown model is `ModelNotFound`, a full line `QueueFull`) and
returns a `GenerationStream` (engine/generation_stream.py) that the caller reads from a thread or an event loop
and may cancel at any time. Invariants: loading, templating, tokenizing and generating happen in a worker thread
per request, never on the caller's thread; a model generates at most ``max_sequences`` sequences at once and at
most ``max_waiting`` more requests wait for a slot (engine/generation_gate.py); a cancelled stream stops its
generator before the next token; stop strings never reach the consumer, not even split across tokens; usage
counts prompt tokens and generated tokens, the end-of-sequence token not counted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edged.backends import GenerativeInstance, Sampling
from edged.backends.genai_config import GenerationLimits, generation_limits
from edged.backends.tool_calls import ToolCall
from edged.engine.generation_gate import SequenceGate
from edged.engine.generation_metrics import metric_families
from edged.engine.generation_stream import (
    Finished,
    FinishReason,
    GenerationStream,
    Sink,
    Started,
    TextDelta,
    Usage,
)
from edged.engine.tool_output import NO_TOOLS, Constraint, ToolOutput, Tools, guidance
from edged.errors import ContextLengthExceeded, EdgedError, InvalidInput, InvalidParameter, ModelNotFound
from edged.exposition import MetricFamily

if TYPE_CHECKING:
    from edged.engine.service import InferenceService

log = logging.getLogger(__name__)

GENAI_RUNTIME = "onnxruntime_genai"
HANDOVER_S = 0.0005
_CANCEL_POLL_S = 0.05  # how soon a request cancelled while it waits for a sequence slot leaves the line
# The most UTF-8 bytes one token of any tokenizer is taken to cover (real text averages about 4, code's
# indentation runs a few tens): a prompt longer than this many bytes per token the model takes is refused
# before tokenizing it. ORT GenAI's encode holds the GIL (6 MB of text stalled the event loop for 0.4 s), so a
# 50 MB prompt would have held the whole daemon for seconds only to be refused by its token count.
BYTES_PER_TOKEN_BOUND = 64


@dataclass(frozen=True)
class GenerationRequest:
    """``prompt`` set: the text as given, no chat template; else ``messages`` go through the model's template."""

    model: str
    messages: tuple[Mapping[str, Any], ...] = ()
    prompt: str | None = None
    tools: Tools = NO_TOOLS  # the definitions go to the chat template when active, and the output is parsed
    max_tokens: int | None = None  # None: as many as the context leaves
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    response_format: Constraint | None = None  # a JSON schema the output is constrained to; None: free text
    max_tokens_field: str = "max_tokens"  # the request field that set max_tokens, named when it is refused


class StopText:
    """Cuts the output at the first stop string, holding back a tail that could be the start of one."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = stops
        self._hold = max((len(s) for s in stops), default=1) - 1
        self._text = ""

    def feed(self, text: str) -> tuple[str, bool]:
        if not self._stops:
            return text, False
        self._text += text
        # the stop completed first wins, as if the text had come one character at a time (a longer stop that
        # began earlier but ends later would not have been generated); of two ending together, the longer
        ends = [(i + len(s), i) for i, s in ((self._text.find(s), s) for s in self._stops) if i >= 0]
        if ends:
            out, self._text = self._text[:min(ends)[1]], ""
            return out, True
        cut = max(0, len(self._text) - self._hold)  # never negative: a short text is all held
        out, self._text = self._text[:cut], self._text[cut:]
        return out, False

    def flush(self) -> str:
        out, self._text = self._text, ""
        return out


class GenerationService:
    def __init__(self, service: InferenceService) -> None:
        self._service = service
        self._gates: dict[str, SequenceGate] = {}
        self._lock = threading.Lock()
        # telemetry's energy per unit of work by model (for generative models: per output token); set by the
        # daemon when telemetry runs
        self.energy_per_unit_mj: Callable[[], Mapping[str, float]] | None = None

    def submit(self, request: GenerationRequest,
               deliver: tuple[asyncio.AbstractEventLoop, Sink] | None = None) -> GenerationStream:
        """``deliver``: have the stream's batches delivered to a callback on an event loop from the start
        (`GenerationStream.deliver_to`), so that the worker never waits for the loop to subscribe."""
        gate = self._gate(request.model)
        gate.admit(request.model)
        stream = GenerationStream()
        if deliver is not None:
            stream.deliver_to(*deliver)
        worker = _Worker(self, request, stream, gate)
        threading.Thread(target=worker.run, name=f"generate-{request.model}", daemon=True).start()
        return stream

    def generative_models(self) -> list[str]:
        return list(self.ready_generative())

    def ready_generative(self, index: list[dict[str, Any]] | None = None) -> dict[str, int]:
        """The ready generative models, each once, with when its served version became ready (Unix seconds,
        OpenAI's Model ``created``). The index (``index``: one read before) is read without the registry lock,
        so a model it lists may be unloading by the time its version is looked up: it is left out, not an error
        (a 500 for the whole list)."""
        ready: dict[str, int] = {}
        for entry in self._service.repository_index(ready_only=True) if index is None else index:
            name = entry["name"]
            if name in ready:  # one entry per ready version
                continue
            try:
                version = self._service.version_info(name)
            except EdgedError:  # unloaded since the index was read
                continue
            if version.config.runtime == GENAI_RUNTIME:
                ready[name] = int(version.lifecycle.changed_at)
        return ready

    def instance(self, model: str) -> GenerativeInstance:
        """The ready generative instance of ``model``, loading a lazily loaded model first (blocking)."""
        if model not in self._service.model_names():
            raise ModelNotFound(f"model {model!r} is not in the repository (see GET /v1/models)")
        self._service.ensure_loaded(model)
        version = self._service.version_info(model)
        instance = version.instances[0] if version.instances else None
        if not isinstance(instance, GenerativeInstance):
            raise InvalidParameter(f"model {model!r} is not a generative model (backend "
                                   f"{version.config.runtime!r}); generation needs backend {GENAI_RUNTIME!r}",
                                   "model")
        return instance

    def loaded_limits(self, model: str) -> GenerationLimits:
        return generation_limits(model, self._service.model_config(model).parameters)

    def metric_families(self) -> list[MetricFamily]:
        with self._lock:
            gates = sorted(self._gates.items())
        energy = self.energy_per_unit_mj() if self.energy_per_unit_mj is not None else {}
        return metric_families([(model, gate.stats, gate.admitted) for model, gate in gates], energy)

    def statistics(self, model: str) -> dict[str, Any] | None:
        """The model's generation figures for the statistics extension; None for a model never asked."""
        with self._lock:
            gate = self._gates.get(model)
        return None if gate is None else {**gate.stats.as_json(), "limits": dataclasses.asdict(gate.limits)}

    def activity(self) -> dict[str, tuple[int, int]]:
        """Model → (output tokens, decode ns), cumulative: what telemetry attributes energy by."""
        with self._lock:
            gates = list(self._gates.items())
        return {model: (gate.stats.output_tokens, gate.stats.decode_ns) for model, gate in gates}

    def _gate(self, model: str) -> SequenceGate:
        # only models of the repository get a gate: a client cycling through names cannot grow the table
        service = self._service
        if model not in service.model_names() or not (service.needs_load(model) or service.model_ready(model)):
            self._check_available(model)
        limits = self._limits(model)
        with self._lock:
            gate = self._gates.get(model)
            if gate is None:
                gate = self._gates[model] = SequenceGate(limits or GenerationLimits())
            elif limits is not None:
                gate.configure(limits)
            return gate

    def _check_available(self, model: str) -> None:
        """ModelNotFound (404, as ``GET /v1/models/{model}`` answers) for a model that is not in the repository,
        not loaded, or whose load failed: nothing a retry would change. A version still loading passes (its
        worker's ModelNotReady is a 503, worth retrying)."""
        entries = [entry for entry in self._service.repository_index() if entry["name"] == model]
        if not entries:
            raise ModelNotFound(f"model {model!r} is not in the repository (see GET /v1/models)")
        if any(entry["state"] in ("LOADING", "READY") for entry in entries):
            return
        reason = next((entry["reason"] for entry in entries if entry["reason"]), "")
        why = f" ({reason})" if reason else ""
        loaded = model in self._service.model_names()
        raise ModelNotFound(f"model {model!r} is in the repository but "
                            + (f"its load failed{why}; fix it and load it again" if loaded else
                               f"not loaded{why}; load it") + f" (POST /v2/repository/models/{model}/load); "
                            "GET /v1/models lists the ready models")

    def _limits(self, model: str) -> GenerationLimits | None:
        """The model's limits from its config; None for a lazily loaded model not loaded yet (its worker applies
        them once the load has read the config)."""
        if self._service.needs_load(model):
            return None
        return generation_limits(model, self._service.model_config(model).parameters)


class _Worker:
    """One request's work in its worker thread."""

    def __init__(self, owner: GenerationService, request: GenerationRequest, stream: GenerationStream,
                 gate: SequenceGate) -> None:
        self._owner = owner
        self._request = request
        self._stream = stream
        self._gate = gate
        self._admitted = time.perf_counter()
        self._prompt_tokens = 0
        self._count = 0
        self._decode_ns = 0
        self._holding = False
        self._calls: tuple[ToolCall, ...] = ()
        self._handed_over = 0.0  # perf_counter of the last hand-over to the consumer

    def run(self) -> None:
        # The gate is left before the terminal item reaches the consumer: a client that sends its next request
        # as soon as it reads the answer (a 400 for a prompt too long, or the last token) must find this
        # request's place free, not a 429 naming a sequence that has already ended.
        terminal: Finished | BaseException | None = None
        try:
            terminal = self._outcome()
        finally:
            self._gate.leave()
            if terminal is not None:
                self._stream.put(terminal)

    def _outcome(self) -> Finished | BaseException:
        stats = self._gate.stats
        try:
            instance = self._owner.instance(self._request.model)
            self._gate.configure(self._owner.loaded_limits(self._request.model))
            prompt, sampling = _prepare(instance, self._request, self._gate.limits)
            self._prompt_tokens = len(prompt)
            reason = self._in_slot(instance, prompt, sampling)
            stats.ended("cancelled" if reason == "cancelled" else "completed", len(prompt), self._count,
                        self._decode_ns, self._holding)
            return Finished(reason, Usage(len(prompt), self._count), self._calls)
        except EdgedError as e:
            stats.ended("refused", self._prompt_tokens, self._count, self._decode_ns, self._holding)
            return e
        except Exception as e:  # a worker thread: an escaping error would leave the consumer waiting forever
            log.error("generation failed for model %s", self._request.model, exc_info=e)
            stats.ended("failed", self._prompt_tokens, self._count, self._decode_ns, self._holding)
            return e

    def _in_slot(self, instance: GenerativeInstance, prompt: list[int], sampling: Sampling) -> FinishReason:
        slot = self._gate.running
        # wait for a sequence slot, but leave the line as soon as the consumer cancels
        while not slot.acquire(timeout=_CANCEL_POLL_S):
            if self._stream.cancelled:
                return "cancelled"
        try:
            self._holding = True
            self._gate.stats.started()
            self._stream.put(Started(len(prompt)), wake=False)  # it leaves with the first token
            return self._generate(instance, prompt, sampling)
        finally:
            slot.release()

    def _generate(self, instance: GenerativeInstance, prompt: list[int], sampling: Sampling) -> FinishReason:
        stream = self._stream
        request = self._request
        try:
            tokens = instance.generate(prompt, sampling, stream.cancel_requested)
        except InvalidInput as e:  # the grammar: from response_format, or from the tools a call must match
            raise InvalidParameter(str(e), "response_format" if request.response_format else "tools") from e
        stop = StopText(request.stop)
        tools = ToolOutput(request.tools, instance.tool_parser)
        gaps: list[float] = []
        first = last = 0.0
        reason: FinishReason | None = None
        try:
            for token in tokens:
                now = time.perf_counter()
                if self._count == 0:
                    first = now
                    self._gate.stats.first_token(now - self._admitted)
                else:
                    gaps.append(now - last)
                last = now
                self._count += 1
                text, stopped = stop.feed(token.text)
                self._emit(tools.feed(text))
                if stopped:
                    reason = "stop"
                    break
        finally:
            self._decode_ns = int((last - first) * 1e9)
            self._gate.stats.token_gaps(gaps)
        if stream.cancelled:
            return "cancelled"
        if reason is None:
            self._emit(tools.feed(stop.flush()))
            reason = "stop" if self._count < sampling.max_new_tokens else "length"
        rest, self._calls = tools.finish()
        self._emit(rest)
        # tool_choice required or named with no call: only when max_tokens cut the constrained call short,
        # and then "length" says so (the text generated is the content, as OpenAI returns what the model wrote)
        return "tool_calls" if self._calls else reason

    def _emit(self, text: str) -> None:
        if not text:  # the tool parser holds back text that may become a call
            return
        now = time.perf_counter()
        # Hand over at once unless the last hand-over was less than HANDOVER_S ago: then the text waits for the
        # next token (or the end), so a model faster than a token per HANDOVER_S costs one thread switch per
        # HANDOVER_S instead of one per token, and a token waits at most one token's time.
        if now - self._handed_over < HANDOVER_S:
            self._stream.put(TextDelta(text), wake=False)
            return
        self._handed_over = now
        if self._stream.put(TextDelta(text)):
            # The consumer's event loop was waiting and has been woken: hand it the GIL now, or it waits for the
            # interpreter's switch interval (5 ms) while this thread generates on, and tokens leave in bursts.
            time.sleep(0)


def _prepare(instance: GenerativeInstance, request: GenerationRequest,
             limits: GenerationLimits) -> tuple[list[int], Sampling]:
    text = request.prompt
    tools = request.tools
    if tools.active and instance.tool_parser is None:
        raise InvalidParameter(f"model {request.model!r} takes no tools: its config sets no "
                               "parameters.tool_parser (how its output writes tool calls)", "tools")
    prompt_field = "prompt" if request.prompt is not None else "messages"  # the request field that is too long
    if text is None:
        # the messages' own text first: a template's rendering of a huge conversation is work for nothing too
        _check_prompt_bytes(sum(_message_bytes(m) for m in request.messages), instance, request, limits,
                            prompt_field)
        text = instance.render_chat(request.messages, list(tools.definitions) if tools.active else None,
                                    add_generation_prompt=True)
    _check_prompt_bytes(_utf8_length(text), instance, request, limits, prompt_field)
    if "\x00" in text:  # the tokenizer takes a C string: it would drop the rest of the prompt unsaid
        raise InvalidParameter(f"the prompt holds a NUL character at index {text.index(chr(0))}, where model "
                               f"{request.model!r}'s tokenizer would end it; remove it", prompt_field)
    prompt = instance.encode(text)
    if limits.max_prompt_tokens is not None and len(prompt) > limits.max_prompt_tokens:
        raise ContextLengthExceeded(f"the prompt is {len(prompt)} tokens; model {request.model!r} takes at most "
                                    f"{limits.max_prompt_tokens} (parameter max_prompt_tokens)", prompt_field)
    room = instance.context_length - len(prompt)
    field = request.max_tokens_field
    if limits.max_output_tokens is not None:
        if request.max_tokens is not None and request.max_tokens > limits.max_output_tokens:
            raise InvalidParameter(f"{field} {request.max_tokens} is more than model {request.model!r} "
                                   f"generates: at most {limits.max_output_tokens} (parameter "
                                   "max_output_tokens)", field)
        room = min(room, limits.max_output_tokens)
    if room <= 0:
        raise ContextLengthExceeded(f"the prompt is {len(prompt)} tokens; model {request.model!r} takes at most "
                                    f"{instance.context_length} tokens of prompt and output together",
                                    prompt_field)
    if request.max_tokens is not None and request.max_tokens > room:
        # OpenAI names the prompt's field when prompt and output together pass the context; only a max_tokens
        # that no prompt could leave room for is the parameter's own fault
        alone = request.max_tokens >= instance.context_length
        raise ContextLengthExceeded(f"{field} {request.max_tokens} does not fit: the prompt is {len(prompt)} "
                                    f"tokens and model {request.model!r} takes {instance.context_length} in all; "
                                    + (f"lower {field}" if alone else f"shorten the prompt or lower {field}"),
                                    field if alone else prompt_field)
    sampling = Sampling(request.max_tokens or room, request.temperature, request.top_p, request.top_k,
                        request.seed, guidance(tools, request.response_format, instance.tool_parser))
    return prompt, sampling


def _check_prompt_bytes(size: int, instance: GenerativeInstance, request: GenerationRequest,
                        limits: GenerationLimits, field: str) -> None:
    """Refuse a prompt too long for any tokenization to fit the model, before it is tokenized."""
    tokens = instance.context_length
    if limits.max_prompt_tokens is not None:
        tokens = min(tokens, limits.max_prompt_tokens)
    bound = tokens * BYTES_PER_TOKEN_BOUND
    if size > bound:
        raise ContextLengthExceeded(f"the prompt is {size} bytes; model {request.model!r} takes at most {tokens} "
                                    f"tokens of prompt, so at most {bound} bytes ({BYTES_PER_TOKEN_BOUND} a "
                                    "token, more than any tokenizer packs); shorten the prompt", field)


def _message_bytes(message: Mapping[str, Any]) -> int:
    content = message.get("content")
    size = _utf8_length(content) if isinstance(content, str) else 0
    for call in message.get("tool_calls") or ():  # checked by the front end: {"function": {"arguments": str}}
        function = call.get("function") if isinstance(call, Mapping) else None
        arguments = function.get("arguments") if isinstance(function, Mapping) else None
        size += _utf8_length(arguments) if isinstance(arguments, str) else 0
    return size


def _utf8_length(text: str) -> int:
    """The UTF-8 size of ``text``, without encoding an ASCII one (most prompts)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))

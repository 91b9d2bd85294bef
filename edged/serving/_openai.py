"""OpenAI's chat-completions and completions request and response shapes, parsed and built without any runtime.

A request is checked whole before any work: an unknown or unsupported parameter is refused with a 400 that
names it (OpenAI's clients send only what the caller sets, so nothing legitimate is lost); only the parameters
in ``IGNORED`` (``CHAT_IGNORED``), and those of ``CHAT_NO_EFFECT``/``COMPLETION_NO_EFFECT`` at the value OpenAI
documents as their default, are accepted and ignored, because they change nothing about the answer.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import orjson

from edged.backends.tool_calls import ToolCall
from edged.engine.tool_output import NO_TOOLS, Constraint, Tools
from edged.errors import (
    ContextLengthExceeded,
    EdgedError,
    InvalidParameter,
    ModelNotFound,
    PermissionDenied,
    QueueFull,
)
from edged.serving._limits import RETRY
from edged.serving._response import Response, status_for
from edged.serving._tools import message_tool_calls, parse_response_format, parse_tools, shown

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
# OpenAI's newer name for the instructions' role; chat templates know only "system", so it is rendered as that
_AS_ROLE = {"developer": "system"}
_COMMON = frozenset({"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "stream",
                     "stream_options"})
CHAT_PARAMS = _COMMON | {"messages", "max_completion_tokens", "tools", "tool_choice", "parallel_tool_calls",
                         "response_format"}
COMPLETION_PARAMS = _COMMON | {"prompt"}
COMPLETION_DEFAULT_TOKENS = 16
IGNORED = frozenset({"user"})  # an end-user id for abuse monitoring: nothing to do on a device
# user's successors (safety_identifier) and the key of OpenAI's prompt cache, which changes no answer
CHAT_IGNORED = IGNORED | {"safety_identifier", "prompt_cache_key"}


def _is_zero(value: Any) -> bool:
    return type(value) in (int, float) and value == 0


# OpenAI's parameters that edged does not implement, each with the value OpenAI documents as its default, which
# has no effect on the answer (null is the default of every one): sent so, as clients and frameworks that write
# out every default do, they are accepted; any other value is refused naming the parameter
_NoEffect = tuple[str, Callable[[Any], bool]]
_NO_PENALTY: dict[str, _NoEffect] = {"frequency_penalty": ("0", _is_zero), "presence_penalty": ("0", _is_zero),
                                     "logit_bias": ("{}", lambda v: v == {})}
_NULL_ONLY: _NoEffect = ("null", lambda v: False)
CHAT_NO_EFFECT: dict[str, _NoEffect] = {
    **_NO_PENALTY, "logprobs": ("false", lambda v: v is False), "store": ("false", lambda v: v is False),
    "modalities": ('["text"]', lambda v: v == ["text"]),
    **dict.fromkeys(("top_logprobs", "metadata", "service_tier", "functions", "function_call", "prediction",
                     "reasoning_effort", "audio", "web_search_options", "verbosity", "moderation",
                     "prompt_cache_retention", "prompt_cache_options"), _NULL_ONLY)}
COMPLETION_NO_EFFECT: dict[str, _NoEffect] = {
    **_NO_PENALTY, "echo": ("false", lambda v: v is False), "best_of": ("1", lambda v: type(v) is int and v == 1),
    "logprobs": _NULL_ONLY, "suffix": _NULL_ONLY}
_MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_call_id", "tool_calls"})
_MAX_STOP = 4


ParamError = InvalidParameter  # the family lives in edged.errors so that the engine can raise it too


class Unauthenticated(PermissionDenied):
    """No or a wrong API key on a listener that requires one: 401, as OpenAI answers."""


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: tuple[dict[str, Any], ...]
    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    prompt: str | None = None  # /v1/completions: the prompt as given, no chat template
    tools: Tools = NO_TOOLS
    response_format: Constraint | None = None  # None: plain text
    max_tokens_field: str = "max_tokens"  # the field max_tokens came from (max_completion_tokens or max_tokens)


def parse_chat(body: bytes | bytearray) -> ChatRequest:
    doc = _without_no_effect(_object(body), CHAT_NO_EFFECT)
    _check_supported(doc, CHAT_PARAMS, CHAT_NO_EFFECT, CHAT_IGNORED)
    request = _request(doc, _messages(doc.get("messages")), None, _max_tokens(doc, None))
    request = replace(request, max_tokens_field=_max_tokens_field(doc))
    tools = parse_tools(doc)
    response_format = parse_response_format(doc.get("response_format"))
    if response_format is not None and tools.mode in ("required", "named"):
        raise ParamError(f"'response_format' and tool_choice {tools.mode!r} each constrain the whole answer; "
                         "send one of them", "response_format")
    return replace(request, tools=tools, response_format=response_format)


def parse_completion(body: bytes | bytearray) -> ChatRequest:
    """A legacy ``/v1/completions`` request: a prompt string instead of messages, no chat template, and
    ``max_tokens`` 16 unless given, as OpenAI defines it."""
    doc = _without_no_effect(_object(body), COMPLETION_NO_EFFECT)
    _check_supported(doc, COMPLETION_PARAMS, COMPLETION_NO_EFFECT)
    return completion_request(doc)


def completion_request(doc: dict[str, Any]) -> ChatRequest:
    """`parse_completion` of a document already decoded (Triton's generate extension builds one from its
    parameters, so its sampling rules are the completion parser's without a JSON round trip)."""
    _check_supported(doc, COMPLETION_PARAMS)
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise ParamError("'prompt' must be a non-empty string (or a list of exactly one)", "prompt")
    _no_nul(prompt, "prompt")
    return _request(doc, (), prompt, _max_tokens(doc, COMPLETION_DEFAULT_TOKENS))


def _object(body: bytes | bytearray) -> dict[str, Any]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ParamError(f"the request body is not valid JSON: {e}", None) from e
    if not isinstance(doc, dict):
        raise ParamError(f"the request body must be a JSON object, found {type(doc).__name__}", None)
    return doc


def _without_no_effect(doc: dict[str, Any], no_effect: dict[str, _NoEffect]) -> dict[str, Any]:
    """``doc`` without the parameters of ``no_effect`` that hold null or the value that has no effect."""
    return {name: value for name, value in doc.items()
            if not (name in no_effect and (value is None or no_effect[name][1](value)))}


def _check_supported(doc: dict[str, Any], supported: frozenset[str], no_effect: dict[str, _NoEffect] | None = None,
                     ignored: frozenset[str] = IGNORED) -> None:
    unknown = sorted(set(doc) - supported - ignored)
    if unknown:
        defaults = [f"{name} {no_effect[name][0]}" for name in unknown if no_effect and name in no_effect]
        raise ParamError(f"unsupported parameter(s) {', '.join(unknown)}: edged supports "
                         f"{', '.join(sorted(supported))} (and ignores {', '.join(sorted(ignored))})"
                         + (f"; it takes {', '.join(defaults)} only, OpenAI's default, which changes nothing: "
                            "send that or leave the parameter out" if defaults else ""), unknown[0])


def _request(doc: dict[str, Any], messages: tuple[dict[str, Any], ...], prompt: str | None,
             max_tokens: int | None) -> ChatRequest:
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise ParamError("'model' must be the name of a generative model (see GET /v1/models)", "model")
    n = doc.get("n")
    if n is not None and (type(n) is not int or n != 1):  # null is OpenAI's default (1); true is no count
        raise ParamError(f"'n' must be 1: edged generates one choice per request, found {shown(n)}", "n")
    stream = _bool(doc, "stream")
    options = doc.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream or not isinstance(options, dict) or set(options) - {"include_usage", "include_obfuscation"}:
            raise ParamError("'stream_options' takes only {\"include_usage\": bool, \"include_obfuscation\": bool}, "
                             "and only with stream=true", "stream_options")
        include_usage = _bool(options, "include_usage")
        try:  # OpenAI's padding against network side channels: nothing to pad over loopback or a Unix socket
            _bool(options, "include_obfuscation")
        except ParamError as e:
            raise ParamError(f"stream_options.{e}", "stream_options") from e
    return ChatRequest(model, messages, max_tokens, _number(doc, "temperature", 1.0, 0.0, 2.0),
                       _number(doc, "top_p", 1.0, 0.0, 1.0), _int(doc, "top_k", 0, 0), _seed(doc),
                       _stop(doc.get("stop")), stream, include_usage, prompt)


def _messages(raw: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(raw, list) or not raw:
        raise ParamError("'messages' must be a non-empty list of {role, content} objects", "messages")
    out = []
    for index, message in enumerate(raw):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise ParamError(f"{where} must be an object, found {type(message).__name__}", where)
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:  # a list or object is unhashable: a TypeError, a 500
            raise ParamError(f"{where}.role must be one of {', '.join(sorted(ROLES))}, found "
                             f"{shown(role)}", f"{where}.role")
        extra = sorted(set(message) - _MESSAGE_KEYS)
        if extra:
            raise ParamError(f"{where}: unsupported field(s) {', '.join(extra)}", f"{where}.{extra[0]}")
        out.append(_message(message, role, where))
    return tuple(out)


def _message(message: dict[str, Any], role: str, where: str) -> dict[str, Any]:
    for key in ("name", "tool_call_id"):
        if not isinstance(message.get(key, ""), str):
            raise ParamError(f"{where}.{key} must be a string", f"{where}.{key}")
        _no_nul(message.get(key, ""), f"{where}.{key}")
    out: dict[str, Any] = {k: v for k, v in message.items() if k in ("role", "name", "tool_call_id")}
    out["role"] = _AS_ROLE.get(role, role)
    if "tool_calls" in message:
        if role != "assistant":
            raise ParamError(f"{where}: only assistant messages carry tool_calls", f"{where}.tool_calls")
        out["tool_calls"] = message_tool_calls(message["tool_calls"], where)
        # OpenAI sends content null beside tool calls
        out["content"] = "" if message.get("content") is None else _content(message["content"], where)
        return out
    out["content"] = _content(message.get("content"), where)
    return out


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return _no_nul(content, f"{where}.content")
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return _no_nul("".join(p["text"] for p in content), f"{where}.content")
    raise ParamError(f"{where}.content must be a string or a list of text parts (edged's models take text only)",
                     f"{where}.content")


def _no_nul(text: str, param: str) -> str:
    """``text``, refused if it holds a NUL: the tokenizer takes C strings and silently drops everything after
    one, so the model would answer a prompt cut short."""
    if "\x00" in text:
        raise ParamError(f"{param} holds a NUL character (\\u0000) at index {text.index(chr(0))}; the model's "
                         "tokenizer ends the text there: remove it", param)
    return text


def _max_tokens(doc: dict[str, Any], default: int | None) -> int | None:
    for name in _MAX_TOKENS_FIELDS:
        if doc.get(name) is not None:
            return _int(doc, name, 0, 1)
    return default


_MAX_TOKENS_FIELDS = ("max_completion_tokens", "max_tokens")  # the first one set is used


def _max_tokens_field(doc: dict[str, Any]) -> str:
    return next((name for name in _MAX_TOKENS_FIELDS if doc.get(name) is not None), "max_tokens")


def _stop(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    stops = [raw] if isinstance(raw, str) else raw
    if (not isinstance(stops, list) or len(stops) > _MAX_STOP
            or not all(isinstance(s, str) and s for s in stops)):
        raise ParamError(f"'stop' must be a non-empty string or a list of up to {_MAX_STOP} of them", "stop")
    return tuple(stops)


def _bool(doc: dict[str, Any], name: str, default: bool = False) -> bool:
    value = doc.get(name)
    if value is None:  # OpenAI types its flags "boolean or null": null is the default
        return default
    if not isinstance(value, bool):
        raise ParamError(f"'{name}' must be true or false, found {shown(value)}", name)
    return value


def _number(doc: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = doc.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ParamError(f"'{name}' must be a number from {low} to {high}, found {shown(value)}", name)
    return float(value)


def _int(doc: dict[str, Any], name: str, default: int, low: int) -> int:
    value = doc.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ParamError(f"'{name}' must be an integer of at least {low}, found {shown(value)}", name)
    return value


_SEED_LOW, _SEED_HIGH = -2**63, 2**64 - 1  # OpenAI's seeds are 64-bit; the backend folds them into its own range


def _seed(doc: dict[str, Any]) -> int | None:
    seed = doc.get("seed")
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int) or not _SEED_LOW <= seed <= _SEED_HIGH:
        raise ParamError(f"'seed' must be a 64-bit integer, found {shown(seed)}", "seed")
    return seed


def completion_id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"


def chat_completion(ident: str, model: str, text: str, finish: str, prompt_tokens: int,
                    completion_tokens: int, tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message = {"role": "assistant", "content": text or None, "tool_calls": tool_calls}
    return {"id": ident, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
            "usage": usage(prompt_tokens, completion_tokens)}


def chunk(ident: str, model: str, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {"id": ident, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def openai_calls(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": call.name, "arguments": call.arguments}} for call in calls]


def call_deltas(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Streamed ``delta`` objects, as OpenAI sends them: per call its id and name, then its arguments."""
    deltas = []
    for index, call in enumerate(calls):
        function = call["function"]
        deltas.append({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                       "function": {"name": function["name"], "arguments": ""}}]})
        deltas.append({"tool_calls": [{"index": index, "function": {"arguments": function["arguments"]}}]})
    return deltas


def text_completion(ident: str, model: str, text: str, finish: str | None) -> dict[str, Any]:
    """A /v1/completions answer, or one streamed chunk of it (same object, as OpenAI sends it)."""
    return {"id": ident, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


WWW_AUTHENTICATE = ((b"www-authenticate", b'Bearer realm="edged"'),)  # beside every 401
INVALID_API_KEY = "invalid_api_key"
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # OpenAI's code for a prompt (and max_tokens) past the context

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 403: "permission_error", 404: "not_found_error",
          405: "invalid_request_error", 408: "invalid_request_error", 411: "invalid_request_error",
          413: "invalid_request_error", 415: "invalid_request_error", 431: "invalid_request_error",
          429: "rate_limit_error", 501: "invalid_request_error", 503: "server_error", 505: "invalid_request_error"}


def openai_error(error: BaseException) -> Response:
    """OpenAI's error JSON, with the status of edged's error table; a full queue is 429 as OpenAI answers, with
    the ``Retry-After`` of edged's own 503s (OpenAI's clients wait that long before they retry)."""
    status = 429 if isinstance(error, QueueFull) else 401 if isinstance(error, Unauthenticated) else status_for(error)
    code = ("model_not_found" if isinstance(error, ModelNotFound)
            else INVALID_API_KEY if isinstance(error, Unauthenticated)
            else CONTEXT_LENGTH_EXCEEDED if isinstance(error, ContextLengthExceeded) else None)
    param = error.param if isinstance(error, InvalidParameter) else None
    message = str(error) if isinstance(error, EdgedError) else f"internal error: {type(error).__name__}"
    headers = (WWW_AUTHENTICATE if status == 401
               else RETRY if status in (429, 503) else ())
    return openai_error_response(status, message, param, code, headers)


def openai_error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                          headers: tuple[tuple[bytes, bytes], ...] = ()) -> Response:
    """``{"error": {"message", "type", "param", "code"}}``, the shape every /v1 error has (OpenAI's clients read
    the message from it; Triton's ``{"error": "..."}`` would reach them as an unreadable body)."""
    body = {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "param": param, "code": code}}
    return Response(status, orjson.dumps(body), extra_headers=headers)


def model_object(name: str, created: int) -> dict[str, Any]:
    """One entry of ``GET /v1/models``, and the answer of ``GET /v1/models/{model}`` (OpenAI's Model object);
    ``created``: when the served version was loaded, in Unix seconds."""
    return {"id": name, "object": "model", "created": created, "owned_by": "edged"}

"""OpenAI's chat-completions shapes for a front end that carries them over something other than HTTP (the MQTT
chat topic): requests read by the same parser as ``POST /v1/chat/completions`` (serving/_openai.py), answers
built by the same functions, so both surfaces accept and answer exactly the same JSON.

The daemon hands an `OpenAIChatCodec` to the MQTT front end (edged/mqtt/_chat.py states the protocol it needs):
front ends never import each other, and the OpenAI shapes live here, beside the HTTP routes that define them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from edged.engine.generation import GenerationRequest
from edged.engine.generation_stream import Finished
from edged.serving._chat import generation_request
from edged.serving._openai import (
    chat_completion,
    chunk,
    completion_id,
    openai_calls,
    openai_error,
    parse_chat,
    usage,
)


@dataclass(frozen=True)
class ChatOrder:
    """One chat request as read: what to generate, and how the caller wants the answer."""

    request: GenerationRequest
    model: str
    stream: bool
    include_usage: bool


class OpenAIChatCodec:
    def read(self, body: bytes) -> ChatOrder:
        """The request in ``body`` (an OpenAI chat-completions request); `InvalidParameter` names what is wrong."""
        request = parse_chat(body)
        return ChatOrder(generation_request(request), request.model, request.stream, request.include_usage)

    def new_id(self) -> str:
        return completion_id(True)

    def completion(self, ident: str, model: str, text: str, finished: Finished) -> dict[str, Any]:
        return chat_completion(ident, model, text, finished.reason, finished.usage.prompt_tokens,
                               finished.usage.completion_tokens, openai_calls(finished.tool_calls))

    def chunk(self, ident: str, model: str, delta: dict[str, str], finished: Finished | None = None,
              include_usage: bool = False) -> dict[str, Any]:
        """A ``chat.completion.chunk``; the last one (``finished``) carries the finish reason, the answer's tool
        calls whole (OpenAI streams them in pieces first; here they travel in the one message that is durable),
        and ``usage`` when the request asked for it (OpenAI sends it in a chunk of its own)."""
        if finished is None:
            return chunk(ident, model, delta, None)
        calls = [{"index": i, **call} for i, call in enumerate(openai_calls(finished.tool_calls))]
        doc = chunk(ident, model, {**delta, "tool_calls": calls} if calls else delta, finished.reason)
        if include_usage:
            doc["usage"] = usage(finished.usage.prompt_tokens, finished.usage.completion_tokens)
        return doc

    def error(self, error: BaseException) -> dict[str, Any]:
        """OpenAI's error object, as /v1/chat/completions answers the same error."""
        body: dict[str, Any] = orjson.loads(openai_error(error).body)
        return body

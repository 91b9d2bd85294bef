"""A chat answer's tool calls: what to constrain the output to, and how the output becomes ``tool_calls``.

Streaming holds back only the text that is or may become a call (`ToolParser.hold_from`); everything before
it leaves as content at once, so an answer without calls streams as it would without tools. A call whose
name the request did not define, or whose arguments are not a JSON object, is content: the client never gets
a call it cannot dispatch.
"""

from __future__ import annotations

import uuid
from typing import Any

from edged.backends.tool_calls import ToolCall, ToolParser, call_schema, json_grammar
from edged.serving._tools import Constraint, Tools


def guidance(tools: Tools, response_format: Constraint | None,
             parser: ToolParser | None) -> tuple[str, str] | None:
    """The llguidance grammar this request's output must match; None for free text."""
    if response_format is not None:
        return "json_schema", json_grammar(response_format.schema)
    if parser is None or tools.mode not in ("required", "named"):
        return None
    names = [tools.named] if tools.named is not None else [t["function"]["name"] for t in tools.definitions]
    schemas = [call_schema(name, tools.parameters(name), parser.arguments_key) for name in names]
    return parser.grammar(schemas[0] if len(schemas) == 1 else {"anyOf": schemas})


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


class ToolOutput:
    """Splits one answer's text into content and calls, as it is generated."""

    def __init__(self, tools: Tools, parser: ToolParser | None) -> None:
        self._parser = parser if tools.active else None
        self._defined = frozenset(t["function"]["name"] for t in tools.definitions)
        self._held = ""
        self._at_start = True

    def feed(self, text: str) -> str:
        """The content that can be sent now."""
        if self._parser is None:
            return text
        pending = self._held + text
        index = self._parser.hold_from(pending, self._at_start)
        if index is None:
            index = len(pending)
        out, self._held = pending[:index], pending[index:]
        if out:
            self._at_start = False
        return out

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """(the content not sent yet, the calls in OpenAI's shape) at the end of the answer."""
        held, self._held = self._held, ""
        if self._parser is None or not held:
            return held, []
        parsed = self._parser.parse(held)
        if not parsed.calls or any(call.name not in self._defined for call in parsed.calls):
            return held, []
        return parsed.content, openai_calls(parsed.calls)

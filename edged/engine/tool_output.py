"""A generation's tools: what the request allows, what the output is constrained to, and how the output
becomes tool calls (for every front end: the shapes are the chat template's, not a transport's).

Streaming holds back only the text that is or may become a call (`ToolParser.hold_from`); everything before
it leaves as content at once, so an answer without calls streams as it would without tools. A call whose
name the request did not define is content: the client never gets a call it cannot dispatch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from edged.backends.tool_calls import ToolCall, ToolParser, call_schema, json_grammar

Mode = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True)
class Tools:
    """``definitions`` as the client sent them (``{"type": "function", "function": {...}}``, checked): the
    chat template reads them."""

    definitions: tuple[dict[str, Any], ...]
    mode: Mode
    named: str | None = None  # the function a "named" choice names
    parallel: bool = True  # False: an answer keeps only its first call (OpenAI's parallel_tool_calls)

    @property
    def active(self) -> bool:
        """Whether the model is told about the tools and its output is parsed for calls."""
        return self.mode != "none" and bool(self.definitions)

    def parameters(self, name: str) -> dict[str, Any]:
        for tool in self.definitions:
            if tool["function"]["name"] == name:
                schema: dict[str, Any] = tool["function"].get("parameters", {"type": "object"})
                return schema
        raise KeyError(name)


NO_TOOLS = Tools((), "none")


@dataclass(frozen=True)
class Constraint:
    """A JSON schema the whole output must match (OpenAI's response_format json_object / json_schema)."""

    schema: dict[str, Any]


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


class ToolOutput:
    """Splits one answer's text into content and calls, as it is generated."""

    def __init__(self, tools: Tools, parser: ToolParser | None) -> None:
        self._parser = parser if tools.active else None
        self._defined = frozenset(t["function"]["name"] for t in tools.definitions)
        self._parallel = tools.parallel
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

    def finish(self) -> tuple[str, tuple[ToolCall, ...]]:
        """(the content not sent yet, the calls) at the end of the answer."""
        held, self._held = self._held, ""
        if self._parser is None or not held:
            return held, ()
        parsed = self._parser.parse(held)
        if not parsed.calls or any(call.name not in self._defined for call in parsed.calls):
            return held, ()
        return parsed.content, parsed.calls if self._parallel else parsed.calls[:1]

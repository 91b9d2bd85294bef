"""Tool calls in a generative model's output: one parser per published format, chosen by the model's
``tool_parser`` parameter (config.pbtxt), and the grammar that forces a call when a request requires one.

The chat template writes the tool definitions into the prompt and the parser reads the calls out of the output:
both are the model's format, so both belong to the model, beside its template. Pure text, no runtime.

Guarantees: a parser never raises on model output (the model is untrusted too); text that does not hold a
well-formed call (a JSON object with a string name and object arguments) is content, returned unchanged, so a
model that merely talks about JSON is not turned into a call. Formats (fixtures with their sources in
tests/fixtures/tool_outputs/):

- ``llama3_json``: Llama 3.x JSON tool calling, ``{"name": ..., "parameters": {...}}`` (optionally after
  ``<|python_tag|>``, several separated by ``;``);
- ``mistral``: ``[TOOL_CALLS]`` then a JSON list of ``{"name", "arguments"}`` (tokenizers v3 to v7), or
  ``[TOOL_CALLS]name{...}`` / ``[TOOL_CALLS]name[ARGS]{...}`` (v11 and later);
- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, as Hermes 2 Pro and Qwen2.5
  write them, with free text before them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

TOOL_PARSER_PARAMETER = "tool_parser"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text (OpenAI's ``function.arguments``)


@dataclass(frozen=True)
class Parsed:
    content: str  # the text outside the calls ("" when the output was only calls)
    calls: tuple[ToolCall, ...]


class ToolParser(Protocol):
    name: str
    arguments_key: str  # where a call's arguments are: "parameters" or "arguments"

    def parse(self, text: str) -> Parsed:
        """The calls in a whole output; ``Parsed(text, ())`` when it holds none."""
        ...

    def hold_from(self, text: str, at_start: bool) -> int | None:
        """Where in ``text`` (not yet sent; ``at_start``: nothing of the output was sent before it) a call
        begins or may begin, None when nothing of it can be part of one. A streaming answer sends the text
        before that index as content and holds the rest back."""
        ...

    def grammar(self, call_schema: Mapping[str, Any]) -> tuple[str, str]:
        """(guidance type, grammar) forcing one call whose JSON object matches ``call_schema``
        (``{"name": ..., <arguments key>: ...}``, built with `call_schema`)."""
        ...


def _call(doc: Any, arguments_key: str) -> ToolCall | None:
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str) or not doc["name"]:
        return None
    arguments = doc.get(arguments_key, doc.get("arguments", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string, as OpenAI sends them
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(doc["name"], _arguments_text(arguments))


def _arguments_text(arguments: dict[str, Any]) -> str:
    """The arguments as JSON text that is valid UTF-8: non-ASCII kept as it is (as OpenAI writes it), unless
    the model escaped a lone surrogate (``"\\ud800"``, which json.loads takes): written raw, it is no UTF-8, and
    every encoder of the answer (orjson, the socket) fails on it, so then the text keeps every escape."""
    text = json.dumps(arguments, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(arguments)
    return text


def _objects(text: str) -> list[Any] | None:
    """Every JSON value in ``text``, which must hold nothing else (bar whitespace and ``;`` separators)."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    index = 0
    while True:
        while index < len(text) and text[index] in " \t\r\n;":
            index += 1
        if index == len(text):
            return values
        try:
            value, index = decoder.raw_decode(text, index)
        except ValueError:
            return None
        values.append(value)


def _marker_at(text: str, marker: str) -> int | None:
    """The index of ``marker`` in ``text``, else of a tail of ``text`` that may be its beginning."""
    found = text.find(marker)
    if found >= 0:
        return found
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return len(text) - size
    return None


def call_schema(name: str, parameters: Mapping[str, Any], arguments_key: str) -> dict[str, Any]:
    """The JSON schema of one call of tool ``name`` in a parser's own object shape. A forced call carries only
    the arguments the tool defines unless its schema says otherwise (JSON schema's default would let the model
    invent any), as OpenAI's strict mode does."""
    arguments = {"type": "object", "additionalProperties": False, **parameters}
    return {"type": "object", "properties": {"name": {"const": name}, arguments_key: arguments},
            "required": ["name", arguments_key], "additionalProperties": False}


def json_grammar(schema: Mapping[str, Any]) -> str:
    """A JSON schema as llguidance's grammar text, for compact JSON: llguidance otherwise lets the model pad
    with any whitespace, which small models do until they run out of tokens."""
    return json.dumps({"x-guidance": {"whitespace_flexible": False}, **schema})


class Llama3Json:
    name = "llama3_json"
    arguments_key = "parameters"
    _TAG = "<|python_tag|>"

    def parse(self, text: str) -> Parsed:
        body = text.strip()
        if body.startswith(self._TAG):
            body = body[len(self._TAG):]
        values = _objects(body) if body.startswith("{") else None
        if not values:
            return Parsed(text, ())
        calls = [_call(value, self.arguments_key) for value in values]
        if any(call is None for call in calls):
            return Parsed(text, ())
        return Parsed("", tuple(call for call in calls if call is not None))

    def hold_from(self, text: str, at_start: bool) -> int | None:
        head = text.lstrip()
        if at_start and (head.startswith(("{", self._TAG)) or self._TAG.startswith(head)):
            return 0
        return None  # a Llama 3 call is the whole answer: text first means no call

    def grammar(self, call_schema: Mapping[str, Any]) -> tuple[str, str]:
        return "json_schema", json_grammar(call_schema)


class Mistral:
    name = "mistral"
    arguments_key = "arguments"
    _TAG = "[TOOL_CALLS]"
    _NAMED = re.compile(r"\s*([A-Za-z0-9_.-]+)\s*(?:\[ARGS\])?\s*")

    def parse(self, text: str) -> Parsed:
        start = text.find(self._TAG)
        if start < 0:
            return Parsed(text, ())
        content, rest = text[:start].strip(), text[start + len(self._TAG):]
        calls = self._list(rest) if rest.lstrip().startswith("[") else self._named(rest)
        if not calls:
            return Parsed(text, ())
        return Parsed(content, calls)

    def _list(self, rest: str) -> tuple[ToolCall, ...]:
        values = _objects(rest)
        if not values or len(values) != 1 or not isinstance(values[0], list) or not values[0]:
            return ()
        calls = [_call(value, self.arguments_key) for value in values[0]]
        return () if any(call is None for call in calls) else tuple(c for c in calls if c is not None)

    def _named(self, rest: str) -> tuple[ToolCall, ...]:
        calls = []
        for part in rest.split(self._TAG):
            match = self._NAMED.match(part)
            values = _objects(part[match.end():]) if match else None
            if match is None or not values or len(values) != 1:
                return ()
            call = _call({"name": match.group(1), "arguments": values[0]}, self.arguments_key)
            if call is None:
                return ()
            calls.append(call)
        return tuple(calls)

    def hold_from(self, text: str, at_start: bool) -> int | None:
        return _marker_at(text, self._TAG)

    def grammar(self, call_schema: Mapping[str, Any]) -> tuple[str, str]:
        listed = {"type": "array", "items": call_schema, "minItems": 1, "maxItems": 1}
        return "lark_grammar", f'start: "{self._TAG}" calls\ncalls: %json {json_grammar(listed)}'


class Hermes:
    name = "hermes"
    arguments_key = "arguments"
    _BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
    _OPEN = "<tool_call>"

    def parse(self, text: str) -> Parsed:
        blocks = list(self._BLOCK.finditer(text))
        if not blocks:
            return Parsed(text, ())
        calls = []
        for block in blocks:
            values = _objects(block.group(1))
            call = _call(values[0], self.arguments_key) if values and len(values) == 1 else None
            if call is None:
                return Parsed(text, ())
            calls.append(call)
        ends = [0] + [block.end() for block in blocks]
        starts = [block.start() for block in blocks] + [len(text)]
        content = "".join(text[end:start] for end, start in zip(ends, starts, strict=True))
        return Parsed(content.strip(), tuple(calls))

    def hold_from(self, text: str, at_start: bool) -> int | None:
        return _marker_at(text, self._OPEN)

    def grammar(self, call_schema: Mapping[str, Any]) -> tuple[str, str]:
        return "lark_grammar", f'start: "{self._OPEN}" call "</tool_call>"\ncall: %json {json_grammar(call_schema)}'


PARSERS: dict[str, ToolParser] = {parser.name: parser for parser in (Llama3Json(), Mistral(), Hermes())}


def parser_for(parameters: Mapping[str, str]) -> ToolParser | None:
    """The parser a model config names, None when it names none; ValueError naming the choices otherwise."""
    name = parameters.get(TOOL_PARSER_PARAMETER)
    if name is None:
        return None
    parser = PARSERS.get(name)
    if parser is None:
        raise ValueError(f"parameters.{TOOL_PARSER_PARAMETER} is {name!r}; expected one of "
                         f"{', '.join(sorted(PARSERS))}")
    return parser

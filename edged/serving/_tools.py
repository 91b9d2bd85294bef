"""OpenAI's ``tools``, ``tool_choice``, ``response_format`` and assistant ``tool_calls``, checked whole before
any work: a broken definition is a 400 whose ``param`` names the field (``tools[1].function.parameters``).

What the checks guarantee to the generation path: tool names are unique and of OpenAI's alphabet (so a name
can be written into a grammar literally), every parameters schema is a JSON object, a named ``tool_choice``
names a defined tool, and assistant ``tool_calls`` carry arguments that are a JSON object's text (the chat
template writes them into the prompt verbatim).
"""

from __future__ import annotations

import json
import re
import reprlib
from typing import Any

from edged.engine.tool_output import Constraint, Mode, Tools
from edged.errors import InvalidParameter

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
_MAX_TOOLS = 128
MAX_SCHEMA_DEPTH = 64  # objects and lists in a tool's parameters or a response_format schema (OpenAI's: 10)
_FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})
_FORMAT_KEYS = frozenset({"name", "description", "schema", "strict"})
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 3, 60, 60


ParamError = InvalidParameter


def parse_tools(doc: dict[str, Any]) -> Tools:
    raw = doc.get("tools")
    definitions = () if raw is None else _definitions(raw)
    parallel = doc.get("parallel_tool_calls")
    if parallel is None:  # null is OpenAI's default
        parallel = True
    elif not isinstance(parallel, bool) or not definitions:
        raise ParamError("'parallel_tool_calls' must be true or false, and only beside 'tools'",
                         "parallel_tool_calls")
    choice = doc.get("tool_choice")
    if choice is None:
        return Tools(definitions, "auto" if definitions else "none", None, parallel)
    if choice in ("none", "auto", "required"):
        mode: Mode = choice
        if mode != "none" and not definitions:
            raise ParamError(f"'tool_choice' is {choice!r} but the request defines no 'tools'", "tool_choice")
        return Tools(definitions, mode, None, parallel)
    name = _named_choice(choice)
    if name not in {tool["function"]["name"] for tool in definitions}:
        raise ParamError(f"'tool_choice' names function {shown(name)}, which 'tools' does not define", "tool_choice")
    return Tools(definitions, "named", name, parallel)


def _named_choice(choice: Any) -> str:
    function = choice.get("function") if isinstance(choice, dict) else None
    if (not isinstance(choice, dict) or choice.get("type") != "function" or set(choice) != {"type", "function"}
            or not isinstance(function, dict) or set(function) != {"name"} or not isinstance(function["name"], str)):
        raise ParamError("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                         "{\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")
    name: str = function["name"]
    return name


def _definitions(raw: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(raw, list) or not 0 < len(raw) <= _MAX_TOOLS:
        raise ParamError(f"'tools' must be a list of 1 to {_MAX_TOOLS} tool definitions", "tools")
    seen: set[str] = set()
    out = []
    for index, tool in enumerate(raw):
        where = f"tools[{index}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or set(tool) != {"type", "function"}:
            raise ParamError(f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}} (edged supports "
                             "function tools only)", where)
        function = tool["function"]
        if not isinstance(function, dict):
            raise ParamError(f"{where}.function must be an object", f"{where}.function")
        name = _function(function, f"{where}.function")
        if name in seen:
            raise ParamError(f"{where}.function.name {name!r} is defined twice", f"{where}.function.name")
        seen.add(name)
        out.append(tool)
    return tuple(out)


def _function(function: dict[str, Any], where: str) -> str:
    extra = sorted(set(function) - _FUNCTION_KEYS)
    if extra:
        raise ParamError(f"{where}: unsupported field(s) {', '.join(extra)}", f"{where}.{extra[0]}")
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ParamError(f"{where}.name must be 1 to 64 letters, digits, '_' or '-', found {shown(name)}",
                         f"{where}.name")
    if not isinstance(function.get("description", ""), str):
        raise ParamError(f"{where}.description must be a string", f"{where}.description")
    if not isinstance(function.get("strict", False), bool):
        raise ParamError(f"{where}.strict must be true or false", f"{where}.strict")
    if "parameters" in function:
        _object_schema(function["parameters"], f"{where}.parameters")
    return name


def _object_schema(schema: Any, where: str) -> None:
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise ParamError(f"{where} must be a JSON schema of an object ({{\"type\": \"object\", ...}}), "
                         f"found {shown(schema)}", where)
    _check_depth(schema, where)
    if not isinstance(schema.get("properties", {}), dict):
        raise ParamError(f"{where}.properties must be an object", f"{where}.properties")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ParamError(f"{where}.required must be a list of property names", f"{where}.required")


def _check_depth(schema: Any, where: str) -> None:
    """Refuse a schema nested deeper than `MAX_SCHEMA_DEPTH` (walked without recursion): the chat template and
    the grammar write it with json.dumps, whose recursion a schema a thousand deep (orjson parses 1024) passed,
    a RecursionError in the generation's worker, a 500."""
    level: list[Any] = [schema]
    for _ in range(MAX_SCHEMA_DEPTH):
        level = [child for value in level for child in
                 (value.values() if isinstance(value, dict) else value if isinstance(value, list) else ())]
        if not level:
            return
    raise ParamError(f"{where} is nested more than {MAX_SCHEMA_DEPTH} levels deep; flatten it", where)


def shown(value: Any) -> str:
    """A client's value in a message, short whatever its size or depth (json.dumps or repr of a list nested a
    thousand deep, which orjson parses, is a RecursionError, a 500)."""
    return _SHORT.repr(value)


def parse_response_format(raw: Any) -> Constraint | None:
    """None for plain text. json_object and json_schema are enforced by constrained decoding (llguidance)."""
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "text" and set(raw) == {"type"}:
        return None
    if kind == "json_object" and set(raw) == {"type"}:
        return Constraint({"type": "object"})
    if kind == "json_schema" and set(raw) == {"type", "json_schema"}:
        spec = raw["json_schema"]
        if not isinstance(spec, dict) or set(spec) - _FORMAT_KEYS or not isinstance(spec.get("name"), str):
            raise ParamError("'response_format.json_schema' must be {\"name\": ..., \"schema\": {...}} (and "
                             "optionally description, strict)", "response_format.json_schema")
        schema = spec.get("schema", {})
        if not isinstance(schema, dict):
            raise ParamError("'response_format.json_schema.schema' must be a JSON schema object",
                             "response_format.json_schema.schema")
        _check_depth(schema, "response_format.json_schema.schema")
        return Constraint(schema)
    raise ParamError("'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                     "{\"type\": \"json_schema\", \"json_schema\": {...}}", "response_format")


def message_tool_calls(raw: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls``, checked so that the chat template can replay them."""
    if not isinstance(raw, list) or not raw:
        raise ParamError(f"{where}.tool_calls must be a non-empty list", f"{where}.tool_calls")
    out = []
    for index, call in enumerate(raw):
        at = f"{where}.tool_calls[{index}]"
        function = call.get("function") if isinstance(call, dict) else None
        if (not isinstance(call, dict) or call.get("type", "function") != "function"
                or not isinstance(call.get("id", ""), str) or set(call) - {"id", "type", "function"}
                or not isinstance(function, dict) or set(function) != {"name", "arguments"}):
            raise ParamError(f"{at} must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", "
                             "\"arguments\"}}}}", at)
        if not isinstance(function["name"], str) or not _NAME.fullmatch(function["name"]):
            raise ParamError(f"{at}.function.name must be a function name", f"{at}.function.name")
        try:
            arguments = json.loads(function["arguments"]) if isinstance(function["arguments"], str) else None
        except (ValueError, RecursionError):  # nested past the interpreter's stack: no arguments a tool takes
            arguments = None
        if not isinstance(arguments, dict):
            raise ParamError(f"{at}.function.arguments must be the text of a JSON object",
                             f"{at}.function.arguments")
        out.append({"id": call.get("id", ""), "type": "function",
                    "function": {"name": function["name"], "arguments": function["arguments"]}})
    return out
